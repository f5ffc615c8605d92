"""Router decisions without a network: booking spreads bursts, prefixes stick, health."""

from __future__ import annotations

from collections import Counter

from tokenmill.router.config import GuardConfig, RouterConfig
from tokenmill.router.prompts import RequestKey
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Router
from tokenmill.router.subscriber import EventSubscriber


def make_router(n=2, **config) -> Router:
    specs = [ReplicaSpec.parse(f"http://127.0.0.1:{9000 + i}") for i in range(n)]
    router = Router(RouterConfig(**config), specs)
    for name in router.replicas:
        router.mark_up(name, {"engine": {"block_size": 16, "pid": 1}})
    return router


def key(prefix: int, suffix: int, prefix_tokens: int = 512, suffix_tokens: int = 32) -> RequestKey:
    ids = [1000 + prefix] * prefix_tokens + [5000 + suffix] * suffix_tokens
    return RequestKey(tuple(ids), len(ids))


def stored(router: Router, name: str, k: RequestKey) -> None:
    router.index.apply(name, [["BlockStored", list(k.hashes(16)), None, [], 16, None, "device"]])


def test_burst_of_four_prefixes_spreads_and_keeps_prefixes_together():
    router = make_router()
    placed: dict[int, set[str]] = {}
    for i in range(16):  # all booked before any event or first token
        p = i % 4
        d = router.decide(key(p, i), f"req-{i}")
        placed.setdefault(p, set()).add(d.replica.name)
    per_replica = Counter(next(iter(v)) for v in placed.values())
    assert all(len(v) == 1 for v in placed.values()), placed  # no prefix computed twice
    assert sorted(per_replica.values()) == [2, 2], placed  # and not all on one replica


def test_event_index_hit_wins_and_is_counted():
    router = make_router()
    a, b = list(router.replicas)
    stored(router, b, key(7, 0))
    d = router.decide(key(7, 1), "x")
    assert d.replica.name == b and d.reason == "cache_hit" and d.chosen.hit_blocks == 32
    text = router.metrics.render().decode()
    assert f'tokenmill:router_hit_blocks_total{{replica="{b}"}} 32.0' in text
    assert f'reason="cache_hit",replica="{b}"' in text


def test_pending_prefill_clears_at_first_token_and_finish():
    router = make_router()
    d = router.decide(key(1, 1), "x")
    name = d.replica.name
    assert router.loads.pending_prefill(name) > 30
    router.first_token(d)
    assert router.loads.pending_prefill(name) == 0
    assert router.loads.in_flight(name) == 1
    router.finish(d)
    assert router.loads.in_flight(name) == 0


def test_down_replica_gets_nothing_and_its_entries_go():
    router = make_router()
    a, b = list(router.replicas)
    stored(router, a, key(3, 0))
    router.approx.record(a, key(3, 0).hashes(16), 60)
    router.mark_down(a, "test")
    assert router.index.size(a) == 0 and router.approx.size(a) == 0
    for i in range(5):
        assert router.decide(key(3, i), f"r{i}").replica.name == b
    assert router.decide(key(3, 9), "x", exclude=[b]) is None  # retry finds nobody
    router.mark_down(b, "test")
    assert router.decide(key(3, 9), "y") is None


def test_rejoin_after_restart_resets_state():
    router = make_router()
    a = next(iter(router.replicas))
    stored(router, a, key(3, 0))
    router.mark_up(a, {"engine": {"block_size": 16, "pid": 1}})  # same pid: nothing changes
    assert router.index.size(a) == 34
    router.approx.record(a, key(3, 0).hashes(16), 60)
    router.mark_up(a, {"engine": {"block_size": 16, "pid": 2}})  # restarted
    assert router.approx.size(a) == 0


def test_approximate_index_without_events():
    router = make_router()  # no event endpoints: decisions are the index
    first = router.decide(key(5, 0), "a")
    router.first_token(first)
    router.finish(first)
    again = router.decide(key(5, 1), "b")
    assert again.replica.name == first.replica.name and again.reason == "cache_hit"
    assert router.event_state(first.replica.name) == "none"


def test_guard_sends_to_least_loaded():
    router = make_router(guard=GuardConfig(abs_threshold=3, rel_threshold=1.5))
    a, b = list(router.replicas)
    stored(router, a, key(9, 0))
    for i in range(6):
        router.loads.book(f"busy{i}", a, (), 0.0)
    d = router.decide(key(9, 1), "x")
    assert d.replica.name == b and d.reason == "imbalance_guard"
    assert "tokenmill:router_imbalance_guard_total 1.0" in router.metrics.render().decode()


def test_round_robin_policy_ignores_cache():
    router = make_router(policy="round_robin")
    names = [router.decide(key(1, i), f"r{i}").replica.name for i in range(4)]
    assert names[0] != names[1] and names[0] == names[2]


def test_decision_log_line_has_reasons(caplog):
    import json
    import logging

    router = make_router()
    with caplog.at_level(logging.DEBUG, logger="tokenmill.router.decision"):
        router.decide(key(1, 1), "req-7")
    line = json.loads(caplog.records[-1].getMessage())
    assert line["request_id"] == "req-7" and line["reason"] in ("load", "cache_hit")
    assert len(line["candidates"]) == 2 and "cost" in line["candidates"][0]


def test_replica_spec_parsing():
    s = ReplicaSpec.parse("10.0.0.5:8001,tcp://*:5557,tcp://*:5558")
    assert s.url == "http://10.0.0.5:8001" and s.name == "10.0.0.5:8001"
    assert s.events == "tcp://10.0.0.5:5557" and s.replay == "tcp://10.0.0.5:5558"
    assert ReplicaSpec.parse("http://h:1/").events is None


def test_subscriber_trouble_is_counted_in_metrics():
    router = make_router()
    name = next(iter(router.replicas))
    sub = EventSubscriber(name, router.index, "tcp://127.0.0.1:1", None)  # never started
    router.subscribers[name] = sub
    sub.stats.bad_batches, sub.stats.errors = 2, 1
    text = router.metrics.render().decode()
    assert f'tokenmill:router_kv_event_bad_batches_total{{replica="{name}"}} 2.0' in text
    assert f'tokenmill:router_kv_event_subscriber_errors_total{{replica="{name}"}} 1.0' in text
    sub.stop()


def series_of(router: Router, replica: str) -> dict[str, float]:
    """The router's exposed series labelled with this replica, by name and labels."""
    text = router.metrics.render().decode()
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in lines
        if f'replica="{replica}"' in line
    }


def test_a_replica_that_leaves_takes_its_gauges_along():
    router = make_router()
    gone, stays = list(router.replicas)
    stored(router, gone, key(3, 0))
    router.metrics.kv_transfer_from(gone, {"bytes_sent": 100})
    before = series_of(router, gone)
    assert before[f'tokenmill:router_replica_healthy{{replica="{gone}"}}'] == 1.0
    assert before[f'tokenmill:router_index_blocks{{medium="device",replica="{gone}"}}'] > 0
    router.mark_down(gone, "connection refused")  # it died ...
    router.remove_replica(gone)  # ... and the cluster took it out
    after = series_of(router, gone)
    gauges = ("replica_healthy", "in_flight", "pending_prefill_blocks", "index_blocks",
              "kv_events_synced")  # fmt: skip
    assert not [s for s in after if s.split("{")[0].removeprefix("tokenmill:router_") in gauges]
    assert after[f'tokenmill:router_kv_transfer_bytes_sent_total{{replica="{gone}"}}'] == 100.0
    assert series_of(router, stays)[f'tokenmill:router_replica_healthy{{replica="{stays}"}}'] == 1
    # back under the same address (a new process): healthy again, its totals counted anew
    router.add_replica(ReplicaSpec.parse(f"http://{gone}"))
    router.mark_up(gone, {"engine": {"block_size": 16, "pid": 2}})
    router.metrics.kv_transfer_from(gone, {"bytes_sent": 30})
    back = series_of(router, gone)
    assert back[f'tokenmill:router_replica_healthy{{replica="{gone}"}}'] == 1.0
    assert back[f'tokenmill:router_kv_transfer_bytes_sent_total{{replica="{gone}"}}'] == 130.0
