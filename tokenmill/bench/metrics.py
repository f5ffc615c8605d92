"""Benchmark metrics with vLLM `bench serve` definitions.

Per successful request: TTFT = first streamed token − send; E2E latency = end of stream −
send; TPOT = (E2E − TTFT) / (output tokens − 1) (requests with one output token have no
TPOT); ITL = every token gap: a chunk carrying k tokens after a gap g contributes k gaps of
g / k. Throughputs divide by the run duration (start of the run to the last response).
Goodput = successful requests meeting every SLO per second (a one-token request counts as
TPOT 0, as vLLM). Failed requests (HTTP errors, error events, timeouts, no tokens) are
counted in `failed` and `error_rate` and excluded from latency statistics.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tokenmill.bench.config import SLO
from tokenmill.bench.record import RequestRecord


@dataclass(frozen=True)
class Stats:
    count: int = 0
    mean: float = math.nan
    std: float = math.nan
    median: float = math.nan
    p90: float = math.nan
    p99: float = math.nan
    min: float = math.nan
    max: float = math.nan

    @classmethod
    def of(cls, values: list[float]) -> Stats:
        if not values:
            return cls()
        a = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = np.percentile(a, [50, 90, 99]).tolist()
        return cls(
            len(a), float(a.mean()), float(a.std()), p50, p90, p99, float(a.min()), float(a.max())
        )


def tpot_s(r: RequestRecord) -> float | None:
    n = r.num_output_tokens
    ttft = r.ttft_s
    if ttft is None or n <= 1:
        return None
    return (r.latency_s - ttft) / (n - 1)


def itl_gaps_s(r: RequestRecord) -> list[float]:
    gaps: list[float] = []
    for i in range(1, len(r.chunk_times)):
        k = r.chunk_tokens[i]
        if k > 0:
            gaps.extend([(r.chunk_times[i] - r.chunk_times[i - 1]) / k] * k)
    return gaps


def meets_slo(r: RequestRecord, slo: SLO) -> bool:
    if not r.success:
        return False
    ttft = r.ttft_s or 0.0
    checks = (
        (slo.ttft_ms, ttft),
        (slo.tpot_ms, tpot_s(r) or 0.0),
        (slo.itl_ms, max(itl_gaps_s(r), default=0.0)),
        (slo.e2e_ms, r.latency_s),
    )
    return all(limit is None or value * 1000.0 <= limit for limit, value in checks)


def error_kind(error: str) -> str:
    if error.startswith("timeout"):
        return "timeout"
    return error.split(":", 1)[0].strip()[:60]


@dataclass(frozen=True)
class RunSummary:
    num_requests: int
    completed: int
    failed: int
    error_rate: float
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_throughput: float
    total_input_tokens: int
    total_output_tokens: int
    cached_tokens: int
    cache_hit_rate: float
    goodput: float | None
    slo_attainment: float | None
    mean_concurrency: float
    per_user_output_throughput: float
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    schedule_delay_ms: Stats
    errors: dict[str, int] = field(default_factory=dict)


def summarize(
    records: list[RequestRecord], slo: SLO | None = None, duration_s: float | None = None
) -> RunSummary:
    """Aggregate one run; times in records are seconds from the run's start."""
    slo = slo or SLO()
    ok = [r for r in records if r.success]
    bad = [r for r in records if not r.success]
    if duration_s is None:
        duration_s = max((r.end_s for r in records), default=0.0)
    dur = duration_s if duration_s > 0 else math.nan
    out_tokens = sum(r.num_output_tokens for r in ok)
    in_tokens = sum(
        r.prompt_tokens if r.prompt_tokens is not None else r.expected_input_tokens for r in ok
    )
    with_usage = [r for r in ok if r.prompt_tokens]
    cached = sum(r.cached_tokens or 0 for r in with_usage)
    usage_prompt = sum(r.prompt_tokens or 0 for r in with_usage)
    tpots = [t for r in ok if (t := tpot_s(r)) is not None]
    good = sum(meets_slo(r, slo) for r in ok) if not slo.empty else None
    return RunSummary(
        num_requests=len(records),
        completed=len(ok),
        failed=len(bad),
        error_rate=len(bad) / len(records) if records else 0.0,
        duration_s=duration_s,
        request_throughput=len(ok) / dur,
        output_throughput=out_tokens / dur,
        total_throughput=(in_tokens + out_tokens) / dur,
        total_input_tokens=in_tokens,
        total_output_tokens=out_tokens,
        cached_tokens=cached,
        cache_hit_rate=cached / usage_prompt if usage_prompt else 0.0,
        goodput=None if good is None else good / dur,
        slo_attainment=None if good is None else (good / len(records) if records else 0.0),
        mean_concurrency=sum(r.latency_s for r in records) / dur,
        per_user_output_throughput=float(np.median([1.0 / t for t in tpots if t > 0]))
        if tpots
        else math.nan,
        ttft_ms=Stats.of([r.ttft_s * 1000.0 for r in ok if r.ttft_s is not None]),
        tpot_ms=Stats.of([t * 1000.0 for t in tpots]),
        itl_ms=Stats.of([g * 1000.0 for r in ok for g in itl_gaps_s(r)]),
        e2e_ms=Stats.of([r.latency_s * 1000.0 for r in ok]),
        schedule_delay_ms=Stats.of([r.schedule_delay_s * 1000.0 for r in records]),
        errors=dict(Counter(error_kind(r.error or "") for r in bad)),
    )
