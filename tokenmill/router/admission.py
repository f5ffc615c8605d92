"""The router's own bounded queue: at most `max_in_flight` requests proxied at once, at most
`max_queue` waiting for a slot (each for at most `timeout_s`); beyond that, 503."""

from __future__ import annotations

import asyncio

from tokenmill.server.errors import APIError


def busy(message: str, code: str = "server_busy") -> APIError:
    return APIError(503, message, "server_error", None, code, headers={"Retry-After": "1"})


class Ticket:
    """One admitted request; `release` is idempotent."""

    def __init__(self, admission: Admission | None) -> None:
        self._admission = admission

    def hand_over(self) -> Ticket:
        """A ticket that now owns the slot (e.g. a stream outliving its handler); this one
        becomes a no-op."""
        out = Ticket(self._admission)
        self._admission = None
        return out

    def release(self) -> None:
        if self._admission is not None:
            self._admission._release()
            self._admission = None


class Admission:
    def __init__(self, max_in_flight: int, max_queue: int, timeout_s: float) -> None:
        self.max_in_flight = max_in_flight
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.in_flight = 0
        self.waiting = 0
        self._sem = asyncio.Semaphore(max_in_flight)

    async def acquire(self) -> Ticket:
        if self._sem.locked() and self.waiting >= self.max_queue:
            raise busy(f"router queue full ({self.waiting} waiting)")
        self.waiting += 1
        try:
            await asyncio.wait_for(self._sem.acquire(), self.timeout_s)
        except TimeoutError:
            raise busy(f"no slot in the router's queue within {self.timeout_s:g}s") from None
        finally:
            self.waiting -= 1
        self.in_flight += 1
        return Ticket(self)

    def _release(self) -> None:
        self.in_flight -= 1
        self._sem.release()
