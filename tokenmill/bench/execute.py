"""Runs workloads against one target: model discovery, warmup, one run per load."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import httpx
from rich.console import Console

from tokenmill.bench.client import Prepared, send
from tokenmill.bench.config import SLO, LoadSpec, Target
from tokenmill.bench.contention import BUSY_CORES, CpuProbe, wait_until_idle
from tokenmill.bench.metrics import summarize
from tokenmill.bench.progress import progress_bar
from tokenmill.bench.record import RequestRecord
from tokenmill.bench.results import RunResult
from tokenmill.bench.runner import run_load
from tokenmill.bench.words import WORDS
from tokenmill.bench.workloads import Workload


@dataclass(frozen=True)
class RunOptions:
    slo: SLO = field(default_factory=SLO)
    seed: int = 0
    warmup: int = 1
    max_duration_s: float | None = None
    turn_delay_s: float = 0.0
    progress: bool = True
    wait_idle_s: float = 0.0  # before each run, wait up to this for an idle machine
    retry_busy: int = 0  # rerun (fresh prompts) a run with background CPU, up to N times


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=30.0),
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024),
    )


async def resolve_model(client: httpx.AsyncClient, target: Target) -> str | None:
    """The target's model id, or the first id its /v1/models lists (None if it has none)."""
    if target.model:
        return target.model
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        r = await client.get(f"{target.base_url.rstrip('/')}/v1/models", headers=headers)
        data = r.json().get("data") or []
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, AttributeError):
        return None


async def warmup(
    client: httpx.AsyncClient, target: Target, model: str | None, n: int, seed: int
) -> list[RequestRecord]:
    """n short requests of random words (not from the workload, so caches stay cold)."""
    rng = random.Random(seed ^ 0x5EED)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(32))
        req = Prepared(
            session_id=-1 - i,
            turn=0,
            scheduled_s=0.0,
            max_tokens=8,
            expected_input_tokens=32,
            messages=({"role": "user", "content": text},),
            prompt=text,
        )
        out.append(await send(client, target, model, req, 0.0))
    return out


async def run_target(
    target: Target,
    runs: list[tuple[Workload, LoadSpec]],
    options: RunOptions,
    console: Console | None = None,
    stage: str = "",
    rebuild: Callable[[int, int], Awaitable[Workload]] | None = None,
) -> list[RunResult]:
    """Runs each (workload, load) against the target, one after the other.

    With `options.retry_busy` and `rebuild(run index, attempt)`, a run during which other
    processes used CPU is repeated on a fresh workload (fresh prompts, so no prefix-cache
    hits from the first attempt); the attempt with the least background CPU is kept.
    """
    results = []
    async with http_client() as client:
        model = await resolve_model(client, target)
        if options.warmup:
            failed = [
                r
                for r in await warmup(client, target, model, options.warmup, options.seed)
                if not r.success
            ]
            if failed and console:
                console.print(f"[yellow]{target.name}: warmup failed: {failed[0].error}")
        for i, (workload, load) in enumerate(runs):
            result = await run_once(client, target, model, workload, load, options, console, stage)
            for attempt in range(1, options.retry_busy + 1 if rebuild else 1):
                busy = result.background_cpu or 0.0
                if busy <= BUSY_CORES or rebuild is None:
                    break
                if console:
                    console.print(
                        f"[yellow]{target.name} {load.label}: {busy:.2f} background cores; "
                        f"rerunning on fresh prompts ({attempt}/{options.retry_busy})"
                    )
                again = await run_once(
                    client, target, model, await rebuild(i, attempt), load, options, console, stage
                )
                again = replace(again, attempt=attempt)
                if (again.background_cpu or 0.0) <= busy:
                    result = again
            results.append(result)
    return results


async def run_once(
    client: httpx.AsyncClient,
    target: Target,
    model: str | None,
    workload: Workload,
    load: LoadSpec,
    options: RunOptions,
    console: Console | None = None,
    stage: str = "",
) -> RunResult:
    async def sender(req: Prepared, t0: float) -> RequestRecord:
        return await send(client, target, model, req, t0)

    label = f"{target.name} {workload.name} {load.label}"
    if options.wait_idle_s > 0:
        await wait_until_idle(options.wait_idle_s, log=console.print if console else None)
    probe = CpuProbe().start()
    with progress_bar(label, workload.num_requests, console, options.progress) as on_done:
        records = await run_load(
            workload,
            load,
            sender,
            endpoint=target.endpoint,
            seed=options.seed,
            max_duration_s=options.max_duration_s,
            turn_delay_s=options.turn_delay_s,
            on_done=on_done,
        )
    background = probe.cores()
    records.sort(key=lambda r: (r.start_s, r.session_id, r.turn))
    return RunResult(
        target.name,
        workload.description or workload.name,
        load,
        summarize(records, options.slo),
        tuple(records),
        stage,
        background,
    )
