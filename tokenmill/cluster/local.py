"""Workers as local processes (`tokenmill serve` subprocesses on this machine): no Ray."""

from __future__ import annotations

import itertools
from pathlib import Path

from tokenmill.cluster.launcher import Launcher, WorkerHandle, WorkerRequest, WorkerState
from tokenmill.ports import PortPool
from tokenmill.router.cluster import ReplicaProcess, start_replica, wait_ready


class LocalWorker(WorkerHandle):
    def __init__(self, id: str, request: WorkerRequest, process: ReplicaProcess) -> None:
        self.id = id
        self.request = request
        self.process = process
        self.stopped = False

    def state(self) -> WorkerState:
        proc = self.process.proc
        code = proc.poll()
        status = "ready" if code is None else "stopped" if self.stopped else "dead"
        error = None if code is None or self.stopped else f"exited with {code}"
        return WorkerState(
            status, self.process.spec, str(proc.pid), "local", proc.pid, 0, error
        )  # fmt: skip

    def stop(self, timeout_s: float = 60.0) -> int | None:
        self.stopped = True
        return self.process.stop(timeout_s)


class LocalLauncher(Launcher):
    name = "local"

    def __init__(
        self,
        log_dir: Path,
        host: str = "127.0.0.1",
        log_level: str = "WARNING",
        api_key: str | None = None,
        ports: PortPool | None = None,
    ) -> None:
        self.log_dir = log_dir
        self.ports = ports if ports is not None else PortPool()  # one pool: no port twice
        self.host = host
        self.log_level = log_level
        self.api_key = api_key
        self._ids = itertools.count()

    def start(self, request: WorkerRequest) -> LocalWorker:
        proc = start_replica(
            request.serve_argv(), self.log_dir, request.threads, self.host, self.log_level,
            self.api_key, ports=self.ports,
        )  # fmt: skip
        return LocalWorker(f"{request.role}-{next(self._ids)}", request, proc)

    def wait_ready(self, workers: list[WorkerHandle], timeout_s: float = 300.0) -> None:
        wait_ready([w.process for w in workers if isinstance(w, LocalWorker)], timeout_s)
