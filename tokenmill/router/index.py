"""Which block hashes each replica holds, and in which tier, built from KV events.

Thread-safe: event subscriber threads write, the router's event loop reads. A replica's
entries exist only while it is enabled; disabling (it left or died) purges them and
makes late events for it no-ops until it is enabled again (and resynced).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any

DEVICE, HOST, DISK = 1, 2, 4
MEDIUM_BITS = {"device": DEVICE, "host": HOST, "disk": DISK}


def medium_bit(medium: str | None) -> int:
    # vLLM sends "GPU"/"CPU"/None in older versions; anything unknown counts as device
    return MEDIUM_BITS.get((medium or "device").lower(), DEVICE)


class KVIndex:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[int, dict[str, int]] = {}  # hash -> {replica: tier bits}
        self._held: dict[str, set[int]] = {}  # replica -> hashes (for purges and sizes)

    # ------------------------------------------------------------ membership

    def enable(self, replica: str) -> None:
        with self._lock:
            self._held.setdefault(replica, set())

    def disable(self, replica: str) -> int:
        """Purges the replica's entries; returns how many blocks were dropped."""
        with self._lock:
            held = self._held.pop(replica, set())
            self._drop(replica, held)
            return len(held)

    def clear(self, replica: str) -> None:
        """Forgets the replica's blocks but keeps it enabled (AllBlocksCleared, resync)."""
        with self._lock:
            held = self._held.get(replica)
            if held is not None:
                self._drop(replica, held)
                held.clear()

    def _drop(self, replica: str, hashes: Iterable[int]) -> None:
        for h in hashes:
            holders = self._blocks.get(h)
            if holders is not None:
                holders.pop(replica, None)
                if not holders:
                    del self._blocks[h]

    # ------------------------------------------------------------ events

    def apply(self, replica: str, events: Sequence[Sequence[Any]]) -> None:
        """Applies one KVEventBatch's events (vLLM's array-like encoding)."""
        with self._lock:
            held = self._held.get(replica)
            if held is None:
                return
            for ev in events:
                kind = ev[0]
                if kind == "BlockStored":
                    bit = medium_bit(ev[6] if len(ev) > 6 else None)
                    for h in ev[1]:
                        holders = self._blocks.setdefault(h, {})
                        holders[replica] = holders.get(replica, 0) | bit
                        held.add(h)
                elif kind == "BlockRemoved":
                    bit = medium_bit(ev[2] if len(ev) > 2 else None)
                    for h in ev[1]:
                        holders = self._blocks.get(h)
                        if holders is None or replica not in holders:
                            continue
                        left = holders[replica] & ~bit
                        if left:
                            holders[replica] = left
                        else:
                            del holders[replica]
                            held.discard(h)
                            if not holders:
                                del self._blocks[h]
                elif kind == "AllBlocksCleared":
                    self._drop(replica, held)
                    held.clear()

    # ------------------------------------------------------------ queries

    def tiers(self, replica: str, hashes: Sequence[int]) -> list[int]:
        """Tier bits of each hash on the replica, up to the first block it lacks."""
        return self.tiers_of([replica], hashes)[replica]

    def tiers_of(self, replicas: Sequence[str], hashes: Sequence[int]) -> dict[str, list[int]]:
        """tiers() for several replicas in one walk of the prompt: each hash is looked up
        once, for the replicas that held every hash before it (most drop out at once)."""
        out: dict[str, list[int]] = {r: [] for r in replicas}
        with self._lock:
            alive = list(out)
            for h in hashes:
                holders = self._blocks.get(h)
                if not holders:
                    break
                alive = [r for r in alive if r in holders]
                if not alive:
                    break
                for r in alive:
                    out[r].append(holders[r])
        return out

    def size(self, replica: str) -> int:
        with self._lock:
            return len(self._held.get(replica, ()))

    def sizes_by_medium(self, replica: str) -> dict[str, int]:
        counts = dict.fromkeys(MEDIUM_BITS, 0)
        with self._lock:
            for h in self._held.get(replica, ()):
                bits = self._blocks[h][replica]
                for name, bit in MEDIUM_BITS.items():
                    if bits & bit:
                        counts[name] += 1
        return counts

    def holders(self, h: int) -> dict[str, int]:
        with self._lock:
            return dict(self._blocks.get(h, {}))

    def replicas(self) -> list[str]:
        with self._lock:
            return list(self._held)
