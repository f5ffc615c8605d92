"""Flat rows of run results (for tables, CSV) and ratios against a baseline target."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from tokenmill.bench.metrics import RunSummary, Stats
from tokenmill.bench.results import RunResult

# (key, header, format) of the columns shown in tables; all keys exist in flat_summary().
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("completed", "ok", "{:.0f}"),
    ("failed", "err", "{:.0f}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "out tok/s", "{:.1f}"),
    ("total_throughput", "total tok/s", "{:.1f}"),
    ("ttft_ms_median", "TTFT med ms", "{:.0f}"),
    ("ttft_ms_p99", "TTFT p99 ms", "{:.0f}"),
    ("tpot_ms_median", "TPOT med ms", "{:.1f}"),
    ("tpot_ms_p99", "TPOT p99 ms", "{:.1f}"),
    ("itl_ms_p99", "ITL p99 ms", "{:.1f}"),
    ("e2e_ms_median", "E2E med ms", "{:.0f}"),
    ("cache_hit_rate", "cache hit", "{:.0%}"),
    ("goodput", "goodput req/s", "{:.2f}"),
)
# metrics where a lower value is better (a ratio < 1 favours the numerator)
LOWER_IS_BETTER = {k for k, _, _ in COLUMNS if k.endswith(("_median", "_p99", "_mean"))}
RATIO_KEYS = (
    "request_throughput", "output_throughput", "total_throughput", "ttft_ms_median",
    "ttft_ms_p99", "tpot_ms_median", "tpot_ms_p99", "itl_ms_p99", "e2e_ms_median",
)  # fmt: skip


def flat_summary(s: RunSummary) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in asdict(s).items():
        if isinstance(value, dict) and set(value) == set(asdict(Stats())):
            for stat, v in value.items():
                out[f"{key}_{stat}"] = v
        elif key == "errors":
            out[key] = ";".join(f"{k}={n}" for k, n in value.items())
        else:
            out[key] = value
    return out


def scenario(r: RunResult) -> str:
    return f"{r.workload} · {r.stage or r.load.label}"


def result_row(r: RunResult) -> dict[str, Any]:
    return {
        "target": r.target,
        "workload": r.workload,
        "load": r.load.label,
        "stage": r.stage,
        "background_cpu_cores": getattr(r, "background_cpu", None),
        **flat_summary(r.summary),
    }


def fmt(value: Any, pattern: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return pattern.format(value)


def ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b) if b and not math.isnan(float(b)) else math.nan
    except (TypeError, ValueError):
        return math.nan


def ratio_rows(results: list[RunResult], baseline: str) -> list[dict[str, Any]]:
    """For each scenario the baseline ran: every other target's metrics ÷ the baseline's."""
    by_scenario: dict[str, dict[str, RunResult]] = {}
    for r in results:
        by_scenario.setdefault(scenario(r), {})[r.target] = r
    rows = []
    for scen, targets in by_scenario.items():
        base = targets.get(baseline)
        if base is None:
            continue
        b = flat_summary(base.summary)
        for name, r in targets.items():
            if name == baseline:
                continue
            a = flat_summary(r.summary)
            rows.append(
                {
                    "scenario": scen,
                    "ratio": f"{name} / {baseline}",
                    **{k: ratio(a[k], b[k]) for k in RATIO_KEYS},
                }
            )
    return rows
