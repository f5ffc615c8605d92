"""The router simulation: simulated replicas keep the router's index exact, cache-aware
routing beats round robin on shared prefixes, runs are deterministic, and an idle replica's
TTFT is the cost model's prefill time."""

from __future__ import annotations

import msgpack
import pytest

from tokenmill.kv.hashing import external_hash
from tokenmill.router.config import RouterConfig
from tokenmill.router.index import DEVICE
from tokenmill.router.prompts import RequestKey
from tokenmill.router.sim.conversations import Conversations
from tokenmill.router.sim.costs import CostModel
from tokenmill.router.sim.replica import ReplicaConfig, SimReplica
from tokenmill.router.sim.report import Summary
from tokenmill.router.sim.simulator import Simulation
from tokenmill.router.sim.trace import Trace, TraceConfig, TraceRequest, generate

SMALL = TraceConfig(replicas=4, duration_s=40, session_rate=0.25, min_families=4, seed=3)


def run(trace: Trace, n: int, policy: str, num_blocks: int = 1024):
    sim = Simulation(trace, n, RouterConfig(policy=policy), ReplicaConfig(num_blocks=num_blocks))
    return sim, sim.run()


def exact(sim: Simulation, replica: SimReplica) -> None:
    """The router's index holds exactly the replica's cached blocks."""
    cached = replica.cached_hashes()
    assert sim.router.index.size(replica.name) == len(cached)
    assert all(sim.router.index.holders(h).get(replica.name) == DEVICE for h in cached)


def test_events_keep_the_index_equal_to_the_caches_through_evictions():
    trace = generate(SMALL)
    sim = Simulation(trace, 4, RouterConfig(policy="round_robin"), ReplicaConfig(num_blocks=300))
    removed: list[int] = []
    checks = []
    for replica in sim.replicas.values():
        publish = replica.publish

        def checked(seq: int, payload: bytes, publish=publish, replica=replica) -> None:
            events = msgpack.unpackb(payload)[1]
            removed.extend(h for e in events if e[0] == "BlockRemoved" for h in e[1])
            publish(seq, payload)
            exact(sim, replica)  # every event so far is out: nothing may differ
            checks.append(seq)

        replica.publish = checked
    subscribers = dict(sim.router.subscribers)  # the run stops (and drops) them at its end
    result = sim.run()
    assert len(result.records) == len(trace.requests)
    assert len(checks) > 100
    assert len(removed) > 1000  # the small pools evicted, and said so
    for name, replica in sim.replicas.items():
        exact(sim, replica)
        sub = subscribers[name]
        assert sub.state == "synced" and sub.stats.gaps == 0
        assert sub.stats.batches == replica._next_seq > 0
        replica.kv.check_invariants()
        assert replica.kv.pool.num_used_blocks == 0  # every request finished and freed
        assert sim.router.loads.in_flight(name) == 0  # every booking released


def test_cache_aware_hits_more_and_waits_less_than_round_robin():
    trace = generate(SMALL)
    _, ca = run(trace, 4, "cache_aware", num_blocks=400)
    _, rr = run(trace, 4, "round_robin", num_blocks=400)
    a, r = Summary.of(ca, 10), Summary.of(rr, 10)
    assert a.hit_rate > r.hit_rate + 0.15, (a, r)
    assert a.ttft_p90 < r.ttft_p90, (a, r)
    assert abs(a.predicted_hit_rate - a.hit_rate) < 0.02  # the index saw what the caches held


def test_same_seed_same_run_other_seed_other_trace():
    def outcome(seed: int) -> list[tuple]:
        trace = generate(TraceConfig(replicas=3, duration_s=40, seed=seed))
        _, result = run(trace, 3, "cache_aware")
        return [(r.request_id, r.replica, r.cached_tokens, r.ttft) for r in result.records]

    first = outcome(5)
    assert len(first) > 20
    assert outcome(5) == first
    assert outcome(6) != first


def test_idle_replica_ttft_is_the_prefill_cost_and_the_next_turn_hits():
    costs = CostModel()
    budget = ReplicaConfig().max_num_batched_tokens
    bs = 16
    # one session: a 3,000-token first prompt (two prefill chunks), then a second turn
    rows = (TraceRequest(0.0, 0, 0, 0, 500, 40), TraceRequest(1.0, 0, 1, 0, 100, 10))
    trace = Trace(seed=1, vocab=32000, system_tokens=(2500,), requests=rows)
    _, result = run(trace, 1, "cache_aware")
    first, second = sorted(result.records, key=lambda r: r.arrival)
    p1 = 3000
    assert first.prompt_tokens == p1 and first.cached_tokens == 0
    expected = costs.step_time(budget, 0) + costs.step_time(p1 - budget, 0)
    assert first.ttft == pytest.approx(expected, abs=1e-9)
    # the reply decodes alone: 39 more steps of one sequence
    assert first.latency == pytest.approx(expected + 39 * costs.step_time(0, 1), abs=1e-9)
    p2 = p1 + 40 + 100
    cached = (p1 + 40 - 1) // bs * bs  # prompt and reply, but the reply's last token
    assert (second.prompt_tokens, second.cached_tokens) == (p2, cached)
    assert second.predicted_hit_tokens == cached  # the index knew
    assert second.ttft == pytest.approx(costs.step_time(p2 - cached, 0), abs=1e-9)


def test_request_key_hashes_are_the_conversation_hashes():
    trace = generate(TraceConfig(replicas=1, duration_s=30, seed=2))
    conv = Conversations(trace)
    r = trace.requests[0]
    prompt = conv.prompt(r)
    key = RequestKey(tuple(prompt.token_ids), len(prompt.token_ids))
    assert key.hashes(16) == tuple(external_hash(h) for h in prompt.hashes)
    assert len(key.hashes(16)) == len(prompt.token_ids) // 16 > 0


def test_a_malformed_trace_file_is_a_clear_error(tmp_path):
    trace = generate(TraceConfig(replicas=2, duration_s=5, seed=3))
    good = tmp_path / "trace.jsonl"
    trace.save(good)
    assert Trace.load(good) == trace
    lines = good.read_text().splitlines()
    for name, text in {
        "empty": "",
        "not json": "garbage\n",
        "no head": lines[1] + "\n",
        "bad row": lines[0] + "\n" + '{"t": 1}\n',
        "wrong type": lines[0] + "\n[1, 2]\n",
    }.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text)
        with pytest.raises(ValueError, match="not a router_sim trace"):
            Trace.load(path)
