"""The router's own guess of what replicas hold: the blocks of requests it sent there, for a
time-to-live. Used alone for replicas that publish no events, as a supplement where the
event index may miss blocks (events were lost), and briefly for every replica, so a burst
sees the prefix it just placed before that replica's events arrive."""

from __future__ import annotations

import time
from collections.abc import Sequence


class ApproxIndex:
    def __init__(self, max_blocks_per_replica: int = 200_000) -> None:
        self._expiry: dict[str, dict[int, float]] = {}  # replica -> hash -> expiry
        self.max_blocks = max_blocks_per_replica

    def record(
        self, replica: str, hashes: Sequence[int], ttl_s: float, now: float | None = None
    ) -> None:
        now = time.monotonic() if now is None else now
        held = self._expiry.setdefault(replica, {})
        until = now + ttl_s
        for h in hashes:
            held.pop(h, None)  # re-insert: dict order is expiry order (oldest first)
            held[h] = until
        if len(held) > self.max_blocks:
            self._expire(held, now, force=len(held) - self.max_blocks)

    @staticmethod
    def _expire(held: dict[int, float], now: float, force: int = 0) -> None:
        drop = []
        for h, until in held.items():
            if until > now and len(drop) >= force:
                break
            drop.append(h)
        for h in drop:
            del held[h]

    def prefix(self, replica: str, hashes: Sequence[int], now: float | None = None) -> int:
        """How many leading hashes the replica is believed to hold."""
        held = self._expiry.get(replica)
        if not held:
            return 0
        now = time.monotonic() if now is None else now
        n = 0
        for h in hashes:
            until = held.get(h)
            if until is None or until <= now:
                break
            n += 1
        return n

    def clear(self, replica: str) -> None:
        self._expiry.pop(replica, None)

    def size(self, replica: str, now: float | None = None) -> int:
        held = self._expiry.get(replica)
        if not held:
            return 0
        self._expire(held, time.monotonic() if now is None else now)
        return len(held)
