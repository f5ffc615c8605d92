"""The KV connector and the scheduler, as each sees the other: what the scheduler asks of
a connector (vLLM's scheduler-side hooks that free blocks), and what a connector asks of
the scheduler (requests in and out), so neither imports the other."""

from __future__ import annotations

from typing import Protocol

from tokenmill.request import Request, RequestStatus


class SchedulerConnector(Protocol):
    def request_finished(self, request: Request) -> bool:
        """A request finished normally: True if the connector keeps its blocks (and frees
        them itself later), False to free them now."""
        ...

    def blocks_lost(self, request: Request, why: str) -> None:
        """The request's blocks are about to be freed early (abort, error, preemption)."""
        ...


class ConnectorScheduler(Protocol):
    """The scheduler, as a connector uses it."""

    connector: SchedulerConnector | None

    def add_request(self, request: Request) -> None: ...

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]: ...
