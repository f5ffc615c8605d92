"""The router's replica set changes while it runs: join, drain, leave (index purged)."""

from __future__ import annotations

import pytest

from tokenmill.router.config import RouterConfig
from tokenmill.router.prompts import RequestKey
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Router

INFO = {"engine": {"block_size": 16, "pid": 1}}


def spec(port: int, events: bool = False) -> ReplicaSpec:
    extra = f",tcp://127.0.0.1:{port + 1000},tcp://127.0.0.1:{port + 2000}" if events else ""
    return ReplicaSpec.parse(f"http://127.0.0.1:{port}{extra}")


def key(n: int) -> RequestKey:
    ids = [100 + n] * 64
    return RequestKey(tuple(ids), len(ids))


def stored(router: Router, name: str, k: RequestKey) -> None:
    router.index.apply(name, [["BlockStored", list(k.hashes(16)), None, [], 16, None, "device"]])


def test_a_replica_joins_unhealthy_then_takes_requests():
    router = Router(RouterConfig(), [spec(9000)])
    router.mark_up("127.0.0.1:9000", INFO)
    r = router.add_replica(spec(9001))
    assert not r.healthy and [x.name for x in router.healthy()] == ["127.0.0.1:9000"]
    with pytest.raises(ValueError):
        router.add_replica(spec(9001))
    router.mark_up(r.name, INFO)
    picked = {router.decide(key(i), f"r{i}").replica.name for i in range(8)}
    assert picked == {"127.0.0.1:9000", "127.0.0.1:9001"}


def two_healthy_replicas() -> Router:
    router = Router(RouterConfig(), [spec(9000), spec(9001)])
    for name in router.replicas:
        router.mark_up(name, INFO)
    return router


def test_drain_stops_new_requests_and_remove_purges_the_index():
    router = two_healthy_replicas()
    k = key(1)
    stored(router, "127.0.0.1:9001", k)
    assert router.index.tiers("127.0.0.1:9001", k.hashes(16))
    d = router.decide(k, "held")  # the cache hit sends it to 9001
    assert d.replica.name == "127.0.0.1:9001"
    router.drain("127.0.0.1:9001")
    assert router.in_flight("127.0.0.1:9001") == 1
    for i in range(6):  # even the prefix it holds goes elsewhere now
        assert router.decide(k, f"new{i}").replica.name == "127.0.0.1:9000"
    router.finish(d)
    assert router.in_flight("127.0.0.1:9001") == 0
    router.remove_replica("127.0.0.1:9001")
    assert list(router.replicas) == ["127.0.0.1:9000"]
    assert "127.0.0.1:9001" not in router.index.replicas()
    assert router.index.holders(k.hashes(16)[0]) == {}
    # late calls about it are no-ops
    router.finish(d)
    router.mark_up("127.0.0.1:9001", INFO)
    router.mark_down("127.0.0.1:9001", "gone")
    router.remove_replica("127.0.0.1:9001")
    assert [s["name"] for s in router.snapshot()["replicas"]] == ["127.0.0.1:9000"]


def test_rejoin_under_the_same_address_starts_from_an_empty_index():
    router = two_healthy_replicas()
    k = key(2)
    stored(router, "127.0.0.1:9001", k)
    router.remove_replica("127.0.0.1:9001")
    r = router.add_replica(spec(9001))
    router.mark_up(r.name, INFO)
    assert router.index.tiers(r.name, k.hashes(16)) == []
    assert router.in_flight(r.name) == 0


def test_subscribers_follow_membership():
    router = Router(RouterConfig(replay_timeout_s=0.1), [spec(9000, events=True)])
    router.start_events()
    try:
        assert set(router.subscribers) == {"127.0.0.1:9000"}
        router.add_replica(spec(9001, events=True))
        assert set(router.subscribers) == {"127.0.0.1:9000", "127.0.0.1:9001"}
        sub = router.subscribers["127.0.0.1:9001"]
        router.remove_replica("127.0.0.1:9001")
        assert set(router.subscribers) == {"127.0.0.1:9000"}
        assert sub._stop.is_set()
    finally:
        router.stop_events()
    router.add_replica(spec(9002, events=True))  # events off: no subscriber
    assert router.subscribers == {}
