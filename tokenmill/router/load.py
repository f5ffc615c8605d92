"""Per-replica load as the router books it: every decision is booked at once, so the next
request of a burst already sees it, long before any event or metric from the replica.

- pending prefill: the blocks a request will compute (prompt minus credited cache hit),
  from the decision until its first token arrives (or a TTL, for non-streamed requests
  whose first token the router never sees);
- active blocks: the distinct prompt blocks of requests in flight (shared prefixes count
  once, as in Dynamo) plus one growing tail block per request;
- requests in flight (the imbalance guard and least-load use these).

Bookings are keyed by an id of their own, one per routed attempt: the client's request id
is neither unique nor trusted (two requests with the same one must not share a booking).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Booking:
    id: int
    request_id: str  # the client's, for logs
    replica: str
    hashes: tuple[int, ...]
    prefill_blocks: float
    pending_until: float  # prefill no longer counted after this (monotonic seconds)
    prefilled: bool = False


@dataclass
class ReplicaLoad:
    bookings: dict[int, Booking] = field(default_factory=dict)
    active: Counter[int] = field(default_factory=Counter)


class LoadTracker:
    def __init__(self, booking_ttl_s: float = 30.0) -> None:
        self.booking_ttl_s = booking_ttl_s
        self._loads: dict[str, ReplicaLoad] = {}
        self._ids = itertools.count()

    def _load(self, replica: str) -> ReplicaLoad:
        return self._loads.setdefault(replica, ReplicaLoad())

    def book(
        self,
        request_id: str,
        replica: str,
        hashes: tuple[int, ...],
        prefill_blocks: float,
        now: float | None = None,
    ) -> Booking:
        now = time.monotonic() if now is None else now
        b = Booking(
            next(self._ids), request_id, replica, hashes, prefill_blocks, now + self.booking_ttl_s
        )
        load = self._load(replica)
        load.bookings[b.id] = b
        load.active.update(hashes)
        return b

    def first_token(self, booking: Booking) -> None:
        booking.prefilled = True

    def finish(self, booking: Booking) -> None:
        """Releases the booking; idempotent."""
        load = self._loads.get(booking.replica)
        if load is None or load.bookings.pop(booking.id, None) is None:
            return
        load.active.subtract(booking.hashes)
        for h in booking.hashes:
            if load.active[h] <= 0:
                del load.active[h]

    def forget(self, replica: str) -> None:
        """The replica left; late `finish` calls for its bookings are no-ops."""
        self._loads.pop(replica, None)

    # ------------------------------------------------------------ reads

    def pending_prefill(
        self, replica: str, now: float | None = None, share: float | None = None
    ) -> float:
        """Booked prompt blocks not yet computed. With `share` (blocks), each prompt counts
        at most that much: on a replica that shares its steps between prompts, a new prompt
        of `share` blocks is done once each one ahead has computed as many (or finished)."""
        load = self._loads.get(replica)
        if load is None:
            return 0.0
        now = time.monotonic() if now is None else now
        cap = float("inf") if share is None else share
        return sum(
            min(b.prefill_blocks, cap)
            for b in load.bookings.values()
            if not b.prefilled and b.pending_until > now
        )

    def active_blocks(self, replica: str, extra: Iterable[int] = ()) -> int:
        """Distinct active blocks (+ one tail per request), with `extra` hashes added (pass a
        set or frozenset to spare a copy per call)."""
        distinct = extra if isinstance(extra, (set, frozenset)) else set(extra)
        load = self._loads.get(replica)
        if load is None:
            return len(distinct)
        new = len(distinct) - len(load.active.keys() & distinct)  # set ops run in C
        return len(load.active) + len(load.bookings) + new

    def in_flight(self, replica: str) -> int:
        load = self._loads.get(replica)
        return len(load.bookings) if load else 0

    def total_in_flight(self) -> int:
        return sum(len(load.bookings) for load in self._loads.values())
