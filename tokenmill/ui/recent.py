"""Exact percentiles of recent requests (TTFT): a histogram's buckets only bound them (a
1.0-2.5 s bucket reads p50 1,462 ms where every request took 1.1-1.25 s), so the metrics
observer also keeps each recent value, bounded by count, and the dashboard takes p50 / p90 /
p99 of those seen within its window (as the benchmark does: linear interpolation)."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from tokenmill.ui.sampler import Base

MAX_RECENT = 2048  # values kept: the window's, up to this many requests


class RecentValues:
    """The latest `maxlen` observations, each with the (monotonic) time it was made."""

    def __init__(
        self, maxlen: int = MAX_RECENT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.clock = clock
        self._values: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()  # added from the engine's output loop, read elsewhere

    def add(self, value: float) -> None:
        with self._lock:
            self._values.append((self.clock(), value))

    def within(self, seconds: float | None) -> list[float]:
        """The values observed in the last `seconds` (None: all kept), oldest first."""
        since = -math.inf if seconds is None else self.clock() - seconds
        with self._lock:
            return [v for t, v in self._values if t >= since]


def quantile(q: float, ordered: Sequence[float]) -> float:
    """The q-quantile (0..1) of sorted values, interpolated between the two nearest ranks
    (numpy's default, the benchmark's)."""
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def recent_percentiles(
    recent: RecentValues, base: Base | None, scale: float = 1000.0
) -> dict[str, float] | None:
    """p50 / p90 / p99 of the values observed since the base reading (all kept without
    one), times `scale` (seconds to ms by default); None without any."""
    ordered = sorted(recent.within(base.seconds if base is not None else None))
    if not ordered:
        return None
    return {
        name: round(quantile(q, ordered) * scale, 3)
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
    }
