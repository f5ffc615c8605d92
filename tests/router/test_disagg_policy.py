"""The conditional disaggregation decision (pure): when a prefill worker takes a prompt."""

from __future__ import annotations

import pytest

from tokenmill.router.disagg import DisaggConfig, eligible_prefill
from tokenmill.router.replicas import Replica, ReplicaSpec


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
    # a prompt longer than the queue bound still goes to an idle worker
    assert names(eligible_prefill(cfg, 8000, 1, [a], {}, {a.name: 0.0})) == [a.name]
    assert eligible_prefill(cfg, 8000, 1, [a], {}, {a.name: 16.0})[1] == "saturated"


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
