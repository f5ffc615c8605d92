"""Workers as Ray actors (`tokenmill[ray]`): each in a placement-group bundle (its CPUs,
memory and GPUs), restarted by Ray when it fails, found again by its state in Ray's actor
table (no dashboard needed). `ray` is imported only here, when a Ray cluster is asked for."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
import uuid
from typing import Any

from tokenmill.cluster.launcher import Launcher, WorkerHandle, WorkerRequest, WorkerState
from tokenmill.cluster.ray_actor import ServeActor
from tokenmill.cluster.ray_config import AUTO, RayConfig
from tokenmill.router.replicas import ReplicaSpec

logger = logging.getLogger("tokenmill.cluster")

GIB = 1 << 30
AUTO_OBJECT_STORE = 128 << 20  # workers pass no objects through Ray: keep it small
Slot = tuple[Any, int]  # (placement group, bundle index)


def import_ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ValueError("--ray needs Ray: pip install 'tokenmill[ray]'") from e
    return ray


class RayWorker(WorkerHandle):
    def __init__(
        self, id: str, request: WorkerRequest, actor: Any, slot: Slot, launcher: RayLauncher
    ) -> None:
        self.id = id
        self.request = request
        self.actor = actor
        self.actor_id: str = actor._actor_id.hex()
        self.slot = slot
        self.launcher = launcher
        self.stopped = False
        self._info: dict | None = None
        self._info_restarts = -1
        self._pending: tuple[Any, int] | None = None  # one info() call in flight at most

    def state(self) -> WorkerState:
        from ray._private.state import actors  # the GCS actor table

        if self.stopped:
            return WorkerState("stopped")
        row = actors(actor_id=self.actor_id) or {}
        status = row.get("State", "PENDING_CREATION")
        restarts = int(row.get("NumRestarts", 0))
        node = (row.get("Address") or {}).get("IPAddress") or None
        pid = row.get("Pid") or None
        if status == "DEAD":
            cause = str(row.get("DeathCause", "")).strip().replace("\n", " ")[:500]
            return WorkerState("dead", node=node, pid=pid, restarts=restarts, error=cause)
        info = self._current_info(restarts) if status == "ALIVE" else None
        if info is None:  # being created (after a failure: re-created) or not answering yet
            waiting = "restarting" if restarts else "starting"
            return WorkerState(waiting, node=node, pid=pid, restarts=restarts)
        spec = ReplicaSpec(info["url"], info["events"], info["replay"])
        return WorkerState(
            "ready", spec, info["incarnation"], info["node"], info["pid"], restarts,
            node_id=info.get("node_id"), ready_s=info.get("ready_s"),
        )  # fmt: skip

    def _current_info(self, restarts: int) -> dict | None:
        """The actor's endpoints for this incarnation, once it answered (waits <= 0.2 s)."""
        ray = self.launcher.ray
        if self._info is not None and self._info_restarts == restarts:
            return self._info
        if self._pending is None:
            self._pending = (self.actor.info.remote(), restarts)
        ref, asked_at = self._pending
        done, _ = ray.wait([ref], timeout=0.2)
        if not done:
            return None
        self._pending = None
        try:
            info = ray.get(ref)
        except ray.exceptions.RayError:
            return None  # it died meanwhile: the next round sees it restarting
        self._info, self._info_restarts = info, asked_at
        return info

    def stop(self, timeout_s: float = 60.0) -> int | None:
        ray = self.launcher.ray
        code = None
        if not self.stopped:
            try:
                code = ray.get(self.actor.stop.remote(timeout_s), timeout=timeout_s + 15)
            except Exception as e:
                logger.warning("worker %s: stop failed (%s); killing it", self.id, e)
            self.kill()
        return code

    def kill(self) -> None:
        if not self.stopped:
            self.stopped = True
            with contextlib.suppress(Exception):
                self.launcher.ray.kill(self.actor, no_restart=True)
            self.launcher.release(self.slot)


class RayLauncher(Launcher):
    name = "ray"

    def __init__(
        self, config: RayConfig, log_level: str = "WARNING", api_key: str | None = None,
        host: str | None = None,
    ) -> None:
        """`api_key`: the key every worker requires (the router presents it). `host`: the
        address workers bind to (None: each node's address, reachable from other nodes)."""
        ray = self.ray = import_ray()
        self.config = config
        self.log_level = log_level
        self.api_key = api_key
        self.host = host
        init = {"namespace": config.namespace, "logging_level": logging.WARNING}
        if config.address == AUTO:
            ray.init(
                address="local", num_cpus=config.head_cpus or os.cpu_count() or 1,
                include_dashboard=False, object_store_memory=AUTO_OBJECT_STORE, **init,
            )  # fmt: skip
        else:
            ray.init(address=config.address, **init)
        has_gpus = ray.cluster_resources().get("GPU", 0) >= 1
        self.gpus = config.gpus if config.gpus is not None else (1.0 if has_gpus else 0.0)
        self.actor_cls = ray.remote(ServeActor)
        self.run_id = uuid.uuid4().hex[:6]
        self._ids = itertools.count()
        self._groups: dict[Any, int] = {}  # placement group -> its bundle count
        self._free: dict[tuple, list[Slot]] = {}  # bundles of stopped workers, by shape
        self.workers: list[RayWorker] = []

    # ------------------------------------------------------------ placement

    def bundle(self, request: WorkerRequest) -> dict[str, float]:
        shape = {"CPU": float(request.threads or 1)}
        if self.config.memory_gb:
            shape["memory"] = float(int(self.config.memory_gb * GIB))
        if self.gpus:
            shape["GPU"] = self.gpus
        return shape

    def _place(self, shapes: list[dict[str, float]]) -> list[Slot]:
        """A bundle for each shape: a free one of a stopped worker, else a new placement
        group (one for all, with the configured strategy) once Ray has reserved it."""
        from ray.util.placement_group import placement_group, remove_placement_group

        slots: list[Slot | None] = []
        for shape in shapes:
            free = self._free.get(tuple(sorted(shape.items())))
            slots.append(free.pop() if free else None)
        need = [i for i, s in enumerate(slots) if s is None]
        if need:
            pg = placement_group([shapes[i] for i in need], strategy=self.config.strategy)
            try:
                self.ray.get(pg.ready(), timeout=self.config.placement_timeout_s)
            except self.ray.exceptions.GetTimeoutError:
                remove_placement_group(pg)
                raise RuntimeError(
                    f"Ray could not place {len(need)} worker(s) ({shapes[need[0]]} each, "
                    f"{self.config.strategy}) within {self.config.placement_timeout_s:g}s; "
                    f"available: {self.ray.available_resources()}"
                ) from None
            self._groups[pg] = len(need)
            for j, i in enumerate(need):
                slots[i] = (pg, j)
        return [s for s in slots if s is not None]

    def release(self, slot: Slot) -> None:
        """A stopped worker's bundle: kept for the next worker, or the whole group returned
        to Ray once none of its bundles is in use."""
        from ray.util.placement_group import remove_placement_group

        pg, _ = slot
        shape = tuple(sorted(pg.bundle_specs[slot[1]].items()))
        self._free.setdefault(shape, []).append(slot)
        in_use = sum(1 for w in self.workers if not w.stopped and w.slot[0] == pg)
        if in_use == 0 and pg in self._groups:
            del self._groups[pg]
            for slots in self._free.values():
                slots[:] = [s for s in slots if s[0] != pg]
            remove_placement_group(pg)

    # ------------------------------------------------------------ workers

    def start(self, request: WorkerRequest) -> RayWorker:
        return self.start_many([request])[0]

    def start_many(self, requests: list[WorkerRequest]) -> list[RayWorker]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        shapes = [self.bundle(r) for r in requests]
        out = []
        for request, shape, slot in zip(requests, shapes, self._place(shapes), strict=True):
            wid = f"{request.role}-{next(self._ids)}"
            actor = self.actor_cls.options(
                name=f"tokenmill-{self.run_id}-{wid}",
                num_cpus=shape["CPU"],
                memory=shape.get("memory"),
                num_gpus=shape.get("GPU", 0),
                max_restarts=self.config.max_restarts,
                max_concurrency=4,  # info() answers while stop() drains
                scheduling_strategy=PlacementGroupSchedulingStrategy(slot[0], slot[1]),
            ).remote(
                request.serve_argv(), request.threads, self.log_level, self.api_key,
                host=self.host,
            )
            worker = RayWorker(wid, request, actor, slot, self)
            self.workers.append(worker)
            out.append(worker)
        return out

    def wait_ready(self, workers: list[WorkerHandle], timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        pending = list(workers)
        while pending:
            for w in list(pending):
                s = w.state()
                if s.status == "ready":
                    pending.remove(w)
                    logger.warning("worker %s ready at %s on %s", w.id, s.spec.url, s.node)
                elif s.status in ("dead", "stopped"):
                    raise RuntimeError(f"worker {w.id} failed to start: {s.error}")
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready in {timeout_s:g}s: {pending[0].id}")
            if pending:
                time.sleep(0.3)

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            w.kill()
        for pg in list(self._groups):
            remove_placement_group(pg)
        self._groups.clear()
        self.ray.shutdown()  # with `auto`, that stops the local head too
