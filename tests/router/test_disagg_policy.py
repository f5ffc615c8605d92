"""The conditional disaggregation decision (pure): when a prefill worker takes a prompt."""

from __future__ import annotations

import pytest

from tokenmill.router.config import RouterConfig
from tokenmill.router.disagg import DisaggConfig, eligible_prefill
from tokenmill.router.prompts import RequestKey
from tokenmill.router.replicas import Replica, ReplicaSpec
from tokenmill.router.router import Router


def worker(port: int, role: str = "prefill") -> Replica:
    r = Replica(ReplicaSpec(f"http://127.0.0.1:{port}"))
    r.learn_kv_transfer({"engine": {"kv_transfer": {"role": role, "endpoint": "tcp://*:7001"}}})
    return r


def names(result) -> list[str]:
    return [r.name for r in result[0]]


def test_conditional_remote_only_for_long_uncached_prompts_and_free_workers():
    a, b = worker(1), worker(2)
    cfg = DisaggConfig(min_uncached_tokens=512, max_prefill_in_flight=2,
                       max_prefill_queue_tokens=4096)  # fmt: skip
    assert eligible_prefill(cfg, 511, 1, [a, b], {})[1] == "short"
    assert names(eligible_prefill(cfg, 512, 1, [a, b], {})) == [a.name, b.name]
    # a worker with max_prefill_in_flight requests, or a queue the prompt would wait behind
    assert names(eligible_prefill(cfg, 600, 1, [a, b], {a.name: 2})) == [b.name]
    assert names(eligible_prefill(cfg, 600, 1, [a, b], {}, {a.name: 3600.0})) == [b.name]
    full = eligible_prefill(cfg, 600, 1, [a, b], {}, {a.name: 3600.0, b.name: 5000.0})
    assert full[:2] == ([], "saturated")
    # a long prompt waits for up to its own length rather than stall the decode streams
    assert names(eligible_prefill(cfg, 8000, 1, [a], {}, {a.name: 8000.0})) == [a.name]
    assert eligible_prefill(cfg, 8000, 1, [a], {}, {a.name: 8001.0})[1] == "saturated"
    assert eligible_prefill(cfg, 3000, 1, [a], {}, {a.name: 3001.0})[1] == "saturated"
    # ... or as long as computing it locally would stall the decode worker's streams
    assert eligible_prefill(cfg, 3000, 1, [a], {}, {a.name: 8999.0}, 3)[1] == "long"
    assert eligible_prefill(cfg, 3000, 1, [a], {}, {a.name: 9001.0}, 3)[1] == "saturated"


@pytest.mark.parametrize(
    "mode, uncached, seqs, pool, code",
    [("never", 9000, 1, True, "off"), ("conditional", 9000, 1, False, "no_prefill_worker"),
     ("conditional", 9000, 2, True, "several_sequences"), ("always", 10, 1, True, "always")],
)  # fmt: skip
def test_modes_and_refusals(mode, uncached, seqs, pool, code):
    cfg = DisaggConfig(mode=mode)
    assert eligible_prefill(cfg, uncached, seqs, [worker(1)] if pool else [], {})[1] == code


def test_roles_and_endpoints_from_server_info():
    r = Replica(ReplicaSpec("http://10.0.0.5:8001"))
    r.learn_kv_transfer({"engine": {"kv_transfer": {"role": "prefill", "endpoint": "tcp://0.0.0.0:7001"}},
                         "kv_transfer_stats": {"bytes_sent": 5}})  # fmt: skip
    assert (r.role, r.kv_endpoint, r.kv_transfer_stats) == (
        "prefill",
        "tcp://10.0.0.5:7001",
        {"bytes_sent": 5},
    )
    for junk in ({}, {"engine": "x"}, {"engine": {"kv_transfer": {"role": "boss", "endpoint": 5}}}):
        r.learn_kv_transfer(junk)
        assert (r.role, r.kv_endpoint) == ("both", None)
    with pytest.raises(ValueError):
        DisaggConfig(mode="sometimes")


def split_router(share: int) -> Router:
    """One decode and one prefill worker; the prefill worker's long_prefill_token_threshold."""
    specs = [ReplicaSpec.parse(f"http://127.0.0.1:{p}") for p in (9001, 9002)]
    router = Router(RouterConfig(disagg=DisaggConfig(min_uncached_tokens=64)), specs)
    for spec, role in zip(specs, ("decode", "prefill"), strict=True):
        kv = {"role": role, "endpoint": "tcp://127.0.0.1:7001"}
        router.mark_up(spec.name, {"engine": {"block_size": 16, "pid": 1, "kv_transfer": kv,
                                              "scheduler": {"long_prefill_token_threshold": share}}})  # fmt: skip
    return router


def prompt(first: int, n: int) -> RequestKey:
    ids = tuple(range(first, first + n))
    return RequestKey(ids, n)


@pytest.mark.parametrize("share, short_remote", [(0, False), (256, True)])
def test_a_short_prompt_waits_behind_a_long_one_only_where_steps_are_not_shared(
    share, short_remote
):
    router = split_router(share)
    long, short = prompt(1000, 6000), prompt(20000, 150)
    d = router.decide(long, "long")
    assert router.decide_disagg(long, d, "long").remote
    dd = router.decide_disagg(short, router.decide(short, "short"), "short")
    # shared steps: the short prompt waits for ~its own length of the long one, not 6000
    assert dd.remote is short_remote
    # a 3,200-token prompt behind the long one waits there (<= 6,000 tokens) rather than
    # stall the decode worker's two streams for 2 x 3,200
    other = prompt(40000, 3200)
    assert router.decide_disagg(other, router.decide(other, "other"), "other").remote
    assert dd.reason == ("uncached 150 >= 64 tokens" if short_remote else
                         "every prefill worker is at max_prefill_in_flight requests or "
                         "max_prefill_queue_tokens")  # fmt: skip


def test_the_prompt_share_is_learned_from_server_info_and_bounded():
    r = worker(1)
    assert r.prompt_share_tokens == 0
    for share, learned in ((256, 256), (-1, 0), ("256", 0), (True, 0), (1 << 40, 0)):
        r.learn_kv_transfer({"engine": {"scheduler": {"long_prefill_token_threshold": share}}})
        assert r.prompt_share_tokens == learned
