"""Summaries of simulation runs: hit rate, TTFT percentiles, router cost; the table."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tokenmill.router.sim.simulator import SimResult


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


@dataclass(frozen=True)
class Summary:
    replicas: int
    policy: str
    requests: int  # measured (arrived within the window)
    hit_rate: float  # cached prompt tokens / prompt tokens, at the replicas
    predicted_hit_rate: float  # what the router's index said, for the chosen replica
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    decide_us_mean: float  # Router.decide, CPU time
    decide_us_p99: float
    wall_s: float

    @classmethod
    def of(cls, result: SimResult, start: float = 0.0, end: float = math.inf) -> Summary:
        """Over the requests that arrived in [start, end) (past warm-up, before the drain)."""
        recs = [r for r in result.records if start <= r.arrival < end]
        prompt = sum(r.prompt_tokens for r in recs) or 1
        ttft = [r.ttft for r in recs]
        decide = [s * 1e6 for s in result.decide_s]
        return cls(
            result.replicas,
            result.policy,
            len(recs),
            sum(r.cached_tokens for r in recs) / prompt,
            sum(r.predicted_hit_tokens for r in recs) / prompt,
            percentile(ttft, 50),
            percentile(ttft, 90),
            percentile(ttft, 99),
            statistics.fmean(decide) if decide else math.nan,
            percentile(decide, 99),
            result.wall_s,
        )


HEADER = (
    "| replicas | policy | requests | KV hit rate | TTFT p50 s | TTFT p90 s | TTFT p99 s "
    "| TTFT p90 vs round robin | decide CPU µs mean / p99 | sim wall s |\n"
    "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def table(summaries: list[Summary]) -> str:
    """Markdown rows, with each policy's TTFT p90 against round robin at the same size."""
    rr = {s.replicas: s.ttft_p90 for s in summaries if s.policy == "round_robin"}
    lines = [HEADER]
    for s in summaries:
        base = rr.get(s.replicas)
        ratio = f"{base / s.ttft_p90:.2f}x lower" if base and s.ttft_p90 > 0 else "—"
        if s.policy == "round_robin":
            ratio = "1.00x"
        lines.append(
            f"| {s.replicas} | {s.policy} | {s.requests:,} | {s.hit_rate:.1%} "
            f"| {s.ttft_p50:.2f} | {s.ttft_p90:.2f} | {s.ttft_p99:.2f} | {ratio} "
            f"| {s.decide_us_mean:,.0f} / {s.decide_us_p99:,.0f} | {s.wall_s:.1f} |"
        )
    return "\n".join(lines)
