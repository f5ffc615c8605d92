"""Planned send times (seconds from the start of a run), deterministic for a seed."""

from __future__ import annotations

import math

import numpy as np


def constant_arrivals(n: int, rate: float) -> list[float]:
    """Evenly spaced at 1/rate; the first request goes at t=0."""
    if math.isinf(rate):
        return [0.0] * n
    return [i / rate for i in range(n)]


def poisson_arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Gamma inter-arrivals as vLLM's `bench serve`: shape = burstiness, mean = 1/rate.

    burstiness 1 is a Poisson process; < 1 burstier, > 1 more regular. The first request
    goes at t=0, each later one after one sampled gap.
    """
    if n <= 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def trace_arrivals(timestamps: list[float], speedup: float = 1.0) -> list[float]:
    """Recorded timestamps shifted to start at 0 and divided by `speedup`."""
    if not timestamps:
        return []
    t0 = min(timestamps)
    return [(t - t0) / speedup for t in timestamps]
