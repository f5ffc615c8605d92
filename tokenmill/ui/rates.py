"""Per-second rates and windowed percentiles between two readings."""

from __future__ import annotations

from tokenmill.ui.histogram import percentiles, window
from tokenmill.ui.readings import Reading
from tokenmill.ui.sampler import Base


def per_second(now: Reading, base: Base | None, name: str, **match: str) -> float:
    if base is None or base.seconds <= 0:
        return 0.0
    delta = now.total(name, **match) - base.reading.total(name, **match)
    return round(max(0.0, delta) / base.seconds, 3)


def per_second_by(now: Reading, base: Base | None, name: str, label: str) -> dict[str, float]:
    if base is None or base.seconds <= 0:
        return {}
    before = base.reading.by(name, label)
    return {
        key: round(max(0.0, value - before.get(key, 0.0)) / base.seconds, 3)
        for key, value in now.by(name, label).items()
    }


def ratio(now: Reading, base: Base | None, part: str, whole: str) -> float | None:
    """Δpart / Δwhole over the base's span (None when `whole` did not move)."""
    if base is None:
        return None
    d_whole = now.total(whole) - base.reading.total(whole)
    if d_whole <= 0:
        return None
    return round((now.total(part) - base.reading.total(part)) / d_whole, 4)


def window_percentiles(
    now: Reading, base: Base | None, histogram: str, scale: float = 1000.0
) -> dict[str, float] | None:
    """p50 / p90 / p99 of what the histogram observed since the base (ms by default)."""
    before = base.reading.buckets(histogram) if base is not None else None
    return percentiles(window(now.buckets(histogram), before), scale)
