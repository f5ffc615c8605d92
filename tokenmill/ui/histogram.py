"""Quantiles of a Prometheus histogram over a time window: the difference of two cumulative
bucket readings, interpolated within a bucket as Prometheus' histogram_quantile does."""

from __future__ import annotations

import math
from collections.abc import Sequence

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), +Inf last


def window(now: Buckets, before: Buckets | None) -> Buckets:
    """Observations between two readings of the same histogram (all of `now` without one)."""
    if not before or len(before) != len(now):
        return now
    return tuple((le, max(0.0, c - b)) for (le, c), (_, b) in zip(now, before, strict=True))


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """The q-quantile (0..1); None without observations. Values in the +Inf bucket report the
    highest finite bound (what Prometheus does)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def percentiles(buckets: Buckets, scale: float = 1.0) -> dict[str, float] | None:
    """p50 / p90 / p99 times `scale` (e.g. 1000: seconds to ms); None without observations."""
    out = {}
    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        value = quantile(q, buckets)
        if value is None:
            return None
        out[name] = round(value * scale, 3)
    return out
