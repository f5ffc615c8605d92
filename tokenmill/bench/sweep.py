"""GuideLLM-style sweep: synchronous, then saturation, then rates evenly in between."""

from __future__ import annotations

import httpx
from rich.console import Console

from tokenmill.bench.config import LoadSpec, Target
from tokenmill.bench.execute import RunOptions, resolve_model, run_once, warmup
from tokenmill.bench.results import RunResult
from tokenmill.bench.workloads import Workload

SWEEP_STAGES_FIXED = 2  # synchronous + throughput


def sweep_rates(sync_rate: float, max_rate: float, n: int) -> list[float]:
    """n rates strictly between the synchronous and the saturated request rates."""
    if n <= 0 or not sync_rate > 0 or not max_rate > sync_rate:
        return []
    step = (max_rate - sync_rate) / (n + 1)
    return [sync_rate + step * (i + 1) for i in range(n)]


async def run_sweep(
    client: httpx.AsyncClient,
    target: Target,
    workloads: list[Workload],
    options: RunOptions,
    *,
    kind: str = "constant",
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    console: Console | None = None,
) -> list[RunResult]:
    """workloads: one per stage (2 + number of rates), so no stage reuses another's prompts."""
    model = await resolve_model(client, target)
    if options.warmup:
        await warmup(client, target, model, options.warmup, options.seed)
    sync = await run_once(
        client, target, model, workloads[0], LoadSpec("concurrency", concurrency=1),
        options, console, "synchronous",
    )  # fmt: skip
    peak = await run_once(
        client, target, model, workloads[1], LoadSpec("throughput", max_concurrency=max_concurrency),
        options, console, "throughput",
    )  # fmt: skip
    results = [sync, peak]
    rates = sweep_rates(
        sync.summary.request_throughput,
        peak.summary.request_throughput,
        len(workloads) - SWEEP_STAGES_FIXED,
    )
    for i, rate in enumerate(rates):
        load = LoadSpec(
            "poisson" if kind == "poisson" else "constant",
            rate=rate,
            burstiness=burstiness,
            max_concurrency=max_concurrency,
        )
        results.append(
            await run_once(
                client, target, model, workloads[2 + i], load, options, console, f"rate {i + 1}"
            )
        )
    return results
