"""Keeps the router's replica set in step with the cluster's workers, and scales them.

Every `interval_s` the manager asks the launcher for each worker's state: a worker that
serves (again) joins the router (its index rebuilt by a full replay of its events); one
that is being restarted is taken out of routing at once (its index purged); a restarted one
(new incarnation: new process, maybe new endpoints) replaces its old entry; one dead for
good leaves. Scaling down drains first: no new requests, the ones in flight finish, then
the worker stops (and its server drains too)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tokenmill.cluster.launcher import Launcher, WorkerHandle, WorkerRequest, WorkerState
from tokenmill.router.replicas import ReplicaSpec
from tokenmill.router.router import Router

logger = logging.getLogger("tokenmill.cluster")


class ClusterManager:
    def __init__(
        self,
        launcher: Launcher,
        request_for: Callable[[str], WorkerRequest],
        interval_s: float = 1.0,
        drain_timeout_s: float = 600.0,
        ready_timeout_s: float = 300.0,
    ) -> None:
        self.launcher = launcher
        self.request_for = request_for  # a new worker of a role (scale up)
        self.interval_s = interval_s
        self.drain_timeout_s = drain_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.workers: list[WorkerHandle] = []
        self.router: Router | None = None
        self.bound: dict[str, tuple[str, str | None]] = {}  # worker -> (replica, incarnation)
        self.leaving: set[str] = set()
        self.states: dict[str, WorkerState] = {}
        self._scaling = asyncio.Lock()
        self._syncing = asyncio.Lock()  # one round at a time: a stale one must not apply

    # ------------------------------------------------------------ start, stop

    def start(self, requests: list[WorkerRequest]) -> list[ReplicaSpec]:
        """Starts the first workers and waits until all serve (stops them on failure);
        returns their endpoints, for the router to start with."""
        try:
            self.workers += self.launcher.start_many(requests)
            self.launcher.wait_ready(self.workers, self.ready_timeout_s)
        except BaseException:
            self.stop_all()
            raise
        self.states = {w.id: w.state() for w in self.workers}
        return [self.states[w.id].spec for w in self.workers if self.states[w.id].spec]

    def attach(self, router: Router) -> None:
        """The router now routes to the started workers' endpoints."""
        self.router = router
        for w in self.workers:
            s = self.states.get(w.id)
            if s is not None and s.spec is not None and s.spec.name in router.replicas:
                self.bound[w.id] = (s.spec.name, s.incarnation)

    def stop_all(self, timeout_s: float = 60.0) -> list[int | None]:
        """Stops every worker, all draining at once; returns their exit codes."""
        try:
            if not self.workers:
                return []
            with ThreadPoolExecutor(len(self.workers)) as pool:
                return list(pool.map(lambda w: w.stop(timeout_s), self.workers))
        finally:
            self.launcher.close()

    # ------------------------------------------------------------ discovery

    async def run(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:
                logger.exception("cluster discovery failed; next round in %.1fs", self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def sync(self) -> None:
        async with self._syncing:
            workers = list(self.workers)
            states = await asyncio.to_thread(lambda: {w.id: w.state() for w in workers})
            self.states.update(states)
            for w in workers:
                if w in self.workers and w.id not in self.leaving:
                    self.apply(w, states[w.id])

    def apply(self, w: WorkerHandle, s: WorkerState) -> None:
        router = self.router
        assert router is not None
        bound = self.bound.get(w.id)
        if s.status == "ready" and s.spec is not None:
            if bound is not None and bound != (s.spec.name, s.incarnation):
                logger.warning("worker %s restarted (%s -> %s)", w.id, bound[0], s.spec.url)
                router.remove_replica(bound[0])
                del self.bound[w.id]
                bound = None
            if bound is None:
                if s.spec.name in router.replicas:  # a stale entry under the same address
                    router.remove_replica(s.spec.name)
                router.add_replica(s.spec)
                self.bound[w.id] = (s.spec.name, s.incarnation)
        elif s.status == "restarting" and bound is not None:
            router.mark_down(bound[0], f"worker {w.id} is being restarted")
        elif s.status in ("dead", "stopped"):
            logger.error("worker %s is gone for good: %s", w.id, s.error)
            if bound is not None:
                router.remove_replica(bound[0])
                self.bound.pop(w.id, None)
            self.workers.remove(w)

    # ------------------------------------------------------------ scaling

    def count(self, role: str) -> int:
        return sum(1 for w in self.workers if w.request.role == role and w.id not in self.leaving)

    async def scale(self, role: str, n: int) -> dict:
        """Starts or drains-and-stops workers of `role` until there are `n`; returns once
        new workers serve through the router and removed ones have stopped."""
        if n < 0:
            raise ValueError("count: must be >= 0")
        async with self._scaling:
            before = self.count(role)
            if role == "both" and n < 1:
                raise ValueError("replicas: must be >= 1")
            if n > before:
                requests = [self.request_for(role) for _ in range(n - before)]
                new = await asyncio.to_thread(self.launcher.start_many, requests)
                self.workers += new
                await self._until_routed(new)
            elif n < before:
                mine = [w for w in self.workers if w.request.role == role]
                victims = [w for w in reversed(mine) if w.id not in self.leaving][: before - n]
                await asyncio.gather(*(self.retire(w) for w in victims))
            return {"role": role, "before": before, "after": self.count(role)}

    async def _until_routed(self, workers: list[WorkerHandle]) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            await self.sync()
            router = self.router
            assert router is not None
            names = [self.bound[w.id][0] for w in workers if w.id in self.bound]
            if len(names) == len(workers) and all(router.replicas[n].healthy for n in names):
                return
            gone = [w.id for w in workers if w not in self.workers]
            if gone:
                raise RuntimeError(f"workers {gone} failed to start")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not serving within {self.ready_timeout_s:g}s")
            await asyncio.sleep(0.3)

    async def retire(self, w: WorkerHandle) -> None:
        """Drain, then stop: no request routed to it is dropped."""
        router = self.router
        assert router is not None
        self.leaving.add(w.id)
        bound = self.bound.get(w.id)
        if bound is not None:
            name = bound[0]
            router.drain(name)
            deadline = time.monotonic() + self.drain_timeout_s
            while router.in_flight(name) and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            router.remove_replica(name)
            self.bound.pop(w.id, None)
        code = await asyncio.to_thread(w.stop)
        logger.warning("worker %s stopped (exit code %s)", w.id, code)
        self.workers.remove(w)
        self.leaving.discard(w.id)

    def describe(self) -> list[dict]:
        out = []
        for w in list(self.workers):
            s = self.states.get(w.id) or WorkerState("starting")
            out.append({
                "id": w.id, "role": w.request.role, "status": s.status,
                "url": s.spec.url if s.spec else None, "node": s.node, "node_id": s.node_id, "pid": s.pid,
                "restarts": s.restarts, "ready_s": s.ready_s, "error": s.error, "leaving": w.id in self.leaving,
                "replica": self.bound.get(w.id, (None,))[0],
            })  # fmt: skip
        return out
