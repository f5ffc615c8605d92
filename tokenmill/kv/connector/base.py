"""What the scheduler asks of a KV connector (vLLM's scheduler-side hooks that free blocks)."""

from __future__ import annotations

from typing import Protocol

from tokenmill.request import Request


class SchedulerConnector(Protocol):
    def request_finished(self, request: Request) -> bool:
        """A request finished normally: True if the connector keeps its blocks (and frees
        them itself later), False to free them now."""
        ...

    def blocks_lost(self, request: Request, why: str) -> None:
        """The request's blocks are about to be freed early (abort, error, preemption)."""
        ...
