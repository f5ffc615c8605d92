"""One interface for "start a worker, tell me its endpoints, stop it", whatever places it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from tokenmill.router.replicas import ReplicaSpec

ROLES = ("both", "prefill", "decode")
# starting: not serving yet; ready: serving at `spec`; restarting: failed, being restarted
# (its old endpoints are gone); dead: failed for good; stopped: stopped on purpose
STATUSES = ("starting", "ready", "restarting", "dead", "stopped")


@dataclass(frozen=True)
class WorkerRequest:
    """What to run: a `tokenmill serve` with these flags, in this role, on `threads` cores."""

    role: str = "both"
    argv: tuple[str, ...] = ()
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role: {self.role!r} is not one of {ROLES}")
        if self.threads is not None and self.threads < 1:
            raise ValueError("threads: must be >= 1")

    def serve_argv(self) -> list[str]:
        """The flags with the role's own (`both` adds none)."""
        return [*self.argv, *(["--role", self.role] if self.role != "both" else [])]


@dataclass(frozen=True)
class WorkerState:
    """A worker as its launcher sees it now. `incarnation` changes with every (re)start, so a
    restarted worker is told apart even if it got the same endpoints."""

    status: str
    spec: ReplicaSpec | None = None
    incarnation: str | None = None
    node: str | None = None
    pid: int | None = None  # of the process that owns the engine (actor or serve process)
    restarts: int = 0
    error: str | None = None
    node_id: str | None = None  # the launcher's id of the node (Ray's), if any
    ready_s: float | None = None  # from its (re)start until it served


class WorkerHandle(ABC):
    """One worker: a `tokenmill serve` (API + engine-core processes) somewhere."""

    id: str
    request: WorkerRequest

    @abstractmethod
    def state(self) -> WorkerState:
        """Cheap and non-blocking (at most a short wait): called every discovery round."""

    @abstractmethod
    def stop(self, timeout_s: float = 60.0) -> int | None:
        """Stops it (SIGTERM: the server drains its requests), returns its exit code if known."""


class Launcher(ABC):
    """Starts workers; `wait_ready` blocks until the given ones serve (or raises)."""

    name: str

    @abstractmethod
    def start(self, request: WorkerRequest) -> WorkerHandle: ...

    def start_many(self, requests: list[WorkerRequest]) -> list[WorkerHandle]:
        """Starts workers together (a launcher that places them as one group overrides it)."""
        return [self.start(r) for r in requests]

    @abstractmethod
    def wait_ready(self, workers: list[WorkerHandle], timeout_s: float = 300.0) -> None: ...

    def close(self) -> None:  # noqa: B027 (optional: nothing to release by default)
        """Releases what the launcher holds (placement groups, a local Ray head)."""
