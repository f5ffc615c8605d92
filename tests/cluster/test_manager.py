"""ClusterManager with a fake launcher: discovery (join, restart, death) and scaling with
drain, without processes or Ray."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tokenmill.cluster.launcher import Launcher, WorkerHandle, WorkerRequest, WorkerState
from tokenmill.cluster.manager import ClusterManager
from tokenmill.cluster.routes import scale_targets
from tokenmill.router.config import RouterConfig
from tokenmill.router.prompts import RequestKey
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Router
from tokenmill.server.errors import APIError

INFO = {"engine": {"block_size": 16, "pid": 1}}
PORTS = itertools.count(9100)


def ready(port: int, incarnation: str = "a") -> WorkerState:
    spec = ReplicaSpec.parse(f"http://127.0.0.1:{port}")
    return WorkerState("ready", spec, incarnation, "node-1", port)


class FakeWorker(WorkerHandle):
    def __init__(self, id: str, request: WorkerRequest) -> None:
        self.id, self.request = id, request
        self.now = ready(next(PORTS))
        self.stops = 0

    def state(self) -> WorkerState:
        return self.now

    def stop(self, timeout_s: float = 60.0) -> int | None:
        self.stops += 1
        self.now = WorkerState("stopped")
        return 0


class FakeLauncher(Launcher):
    name = "fake"

    def __init__(self) -> None:
        self.started: list[FakeWorker] = []
        self.closed = False

    def start(self, request: WorkerRequest) -> FakeWorker:
        w = FakeWorker(f"w{len(self.started)}", request)
        self.started.append(w)
        return w

    def wait_ready(self, workers: list[WorkerHandle], timeout_s: float = 300.0) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def cluster(n: int = 2) -> tuple[ClusterManager, Router, FakeLauncher]:
    launcher = FakeLauncher()
    manager = ClusterManager(launcher, lambda role: WorkerRequest(role), interval_s=0.05)
    specs = manager.start([WorkerRequest() for _ in range(n)])
    router = Router(RouterConfig(), specs)
    manager.attach(router)
    for name in router.replicas:
        router.mark_up(name, INFO)
    return manager, router, launcher


async def health(router: Router) -> None:
    """Stands in for the health loop: every replica answers."""
    while True:
        for name in list(router.replicas):
            router.mark_up(name, INFO)
        await asyncio.sleep(0.02)


def key() -> RequestKey:
    return RequestKey(tuple([7] * 64), 64)


@pytest.mark.anyio
async def test_restart_drops_the_replica_and_adds_it_back_with_a_fresh_index():
    manager, router, launcher = cluster()
    w = launcher.started[1]
    old = w.now.spec.name
    router.index.apply(old, [["BlockStored", list(key().hashes(16)), None, [], 16, None, "device"]])
    w.now = WorkerState("restarting", restarts=1)
    await manager.sync()
    assert not router.replicas[old].healthy and router.index.size(old) == 0
    w.now = ready(next(PORTS), "b")  # restarted, on other ports
    await manager.sync()
    assert old not in router.replicas and w.now.spec.name in router.replicas
    # same ports, new incarnation: still dropped and re-added (nothing of the old kept)
    router.index.apply(
        w.now.spec.name, [["BlockStored", list(key().hashes(16)), None, [], 16, None, "device"]]
    )
    w.now = WorkerState("ready", w.now.spec, "c", "node-1", 1)
    await manager.sync()
    assert router.index.size(w.now.spec.name) == 0 and not router.replicas[w.now.spec.name].healthy
    await manager.sync()  # nothing changes when nothing did
    assert len(router.replicas) == 2


@pytest.mark.anyio
async def test_a_dead_worker_leaves():
    manager, router, launcher = cluster()
    w = launcher.started[0]
    name = w.now.spec.name
    w.now = WorkerState("dead", error="max restarts")
    await manager.sync()
    assert name not in router.replicas and w not in manager.workers
    assert manager.count("both") == 1


@pytest.mark.anyio
async def test_scale_up_returns_once_the_new_workers_serve():
    manager, router, launcher = cluster(1)
    beat = asyncio.create_task(health(router))
    try:
        out = await asyncio.wait_for(manager.scale("both", 3), 5)
    finally:
        beat.cancel()
    assert out == {"role": "both", "before": 1, "after": 3}
    assert len(router.healthy()) == 3


@pytest.mark.anyio
async def test_scale_down_drains_before_stopping():
    manager, router, launcher = cluster(2)
    victim = launcher.started[1]
    name = victim.now.spec.name
    booking = router.loads.book("in-flight", name, (), 0.0)
    task = asyncio.create_task(manager.scale("both", 1))
    await asyncio.sleep(0.3)
    assert not task.done() and router.replicas[name].draining and victim.stops == 0
    assert all(router.decide(key(), f"r{i}").replica.name != name for i in range(5))
    router.loads.finish(booking)
    out = await asyncio.wait_for(task, 5)
    assert out["after"] == 1 and victim.stops == 1 and name not in router.replicas
    assert [w.id for w in manager.workers] == ["w0"]
    with pytest.raises(ValueError):
        await manager.scale("both", 0)
    assert manager.stop_all() == [0] and launcher.closed


def test_scale_body_is_checked():
    assert scale_targets({"replicas": 3}) == {"both": 3}
    assert scale_targets({"prefill": 1, "decode": 2}) == {"prefill": 1, "decode": 2}
    for bad in (None, {}, [], {"replicas": "3"}, {"replicas": -1}, {"replicas": True},
                {"workers": 2}, {"replicas": 10**6}):  # fmt: skip
        with pytest.raises(APIError):
            scale_targets(bad)


def test_a_ray_prefill_worker_binds_its_kv_server_on_the_node_address():
    from tokenmill.cluster.ray_actor import reachable

    prefill = WorkerRequest("prefill", ("--max-num-seqs", "4")).serve_argv()
    assert reachable(prefill, "10.0.0.7")[-2:] == ["--kv-transfer-endpoint", "tcp://10.0.0.7:0"]
    given = [*prefill, "--kv-transfer-endpoint", "tcp://10.0.0.7:7001"]
    assert reachable(given, "10.0.0.7") == given
    decode = WorkerRequest("decode").serve_argv()
    assert reachable(decode, "10.0.0.7") == decode


def test_without_ray_the_ray_path_says_how_to_get_it(monkeypatch):
    import sys

    from tokenmill.cluster.ray_config import RayConfig
    from tokenmill.cluster.ray_launcher import RayLauncher

    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ValueError, match=r"pip install 'tokenmill\[ray\]'"):
        RayLauncher(RayConfig())
    with pytest.raises(ValueError, match="strategy"):
        RayConfig(strategy="RANDOM")


def test_ray_workers_bind_the_router_s_host_on_a_cluster_of_this_machine_alone():
    pytest.importorskip("ray")
    from tokenmill.cluster.cli import ray_worker_host
    from tokenmill.cluster.ray_config import RayConfig
    from tokenmill.cluster.ray_launcher import RayLauncher

    assert ray_worker_host(RayConfig(), "127.0.0.1") == "127.0.0.1"  # `--ray auto`
    assert ray_worker_host(RayConfig(), "0.0.0.0") is None  # the node's address
    assert ray_worker_host(RayConfig(address="10.0.0.2:6379"), "127.0.0.1") is None

    calls = []

    class Actor:
        _actor_id = type("Id", (), {"hex": lambda self: "a1"})()

    class ActorClass:
        def options(self, **_):
            return self

        def remote(self, *args, **kwargs):
            calls.append((args, kwargs))
            return Actor()

    launcher = object.__new__(RayLauncher)  # no Ray started: the actor's arguments only
    launcher.config, launcher.log_level, launcher.api_key = RayConfig(), "WARNING", "k" * 43
    launcher.host, launcher.gpus, launcher.actor_cls = "127.0.0.1", 0.0, ActorClass()
    launcher.run_id, launcher._ids, launcher.workers = "r", itertools.count(), []
    launcher._place = lambda shapes: [(None, i) for i in range(len(shapes))]
    import ray.util.scheduling_strategies as strategies

    real = strategies.PlacementGroupSchedulingStrategy
    strategies.PlacementGroupSchedulingStrategy = lambda *a: None
    try:
        launcher.start_many([WorkerRequest("both")])
    finally:
        strategies.PlacementGroupSchedulingStrategy = real
    [(args, kwargs)] = calls
    assert args[3] == "k" * 43 and kwargs == {"host": "127.0.0.1"}
