"""One benchmark session: targets (already running, or started here) × the plan."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from rich.console import Console

from tokenmill.bench.config import Target
from tokenmill.bench.execute import RunOptions, http_client, run_target
from tokenmill.bench.peers import ManagedServer, ServerSpec
from tokenmill.bench.plan import Plan
from tokenmill.bench.prompts import prompt_maker
from tokenmill.bench.results import RunResult
from tokenmill.bench.server_facts import server_kernels
from tokenmill.bench.sweep import run_sweep
from tokenmill.bench.workloads import Workload, build_workload
from tokenmill.ports import PortPool


@dataclass(frozen=True)
class Source:
    """A target to benchmark; with `server`, it is started before and stopped after."""

    target: Target
    server: ServerSpec | None = None


@contextlib.asynccontextmanager
async def running(
    source: Source, log_dir, console: Console, ports: PortPool | None = None
) -> AsyncIterator[Target]:
    if source.server is None:
        yield source.target
        return
    server = ManagedServer(source.server, log_dir, ports)
    console.print(f"[bold]starting {source.target.name}:[/] {' '.join(server.command)}")
    server.start()
    try:
        yield replace(source.target, base_url=server.base_url)
    finally:
        code = server.stop()
        console.print(f"stopped {source.target.name} (exit {code}); log {server.log_path}")


async def build_workloads(
    plan: Plan, base_url: str, prompt_source: str, seed: int
) -> list[Workload]:
    async with http_client() as client:
        maker = await prompt_maker(client, base_url, prompt_source)
        return [
            await build_workload(spec, maker, seed + 1009 * i)
            for i, spec in enumerate(plan.workloads)
        ]


def rebuilder(plan: Plan, base_url: str, prompt_source: str, seed: int):
    """Fresh prompts for run i's attempt n (same workload spec, another seed)."""

    async def rebuild(i: int, attempt: int) -> Workload:
        async with http_client() as client:
            maker = await prompt_maker(client, base_url, prompt_source)
            return await build_workload(
                plan.workloads[i], maker, seed + 1009 * i + 100_003 * attempt
            )

    return rebuild


async def run_session(
    sources: list[Source],
    plan: Plan,
    options: RunOptions,
    console: Console,
    log_dir,
    prompt_source: str = "auto",
    ports: PortPool | None = None,
) -> tuple[list[RunResult], list[Workload], list[str]]:
    """Runs every source in turn (one server up at a time, on a port from `ports`); prompts
    come from the first target that is up and are reused for all. Returns results,
    workloads, skipped notes."""
    results: list[RunResult] = []
    workloads: list[Workload] | None = None
    skipped: list[str] = []
    for source in sources:
        try:
            async with running(source, log_dir, console, ports) as target:
                if workloads is None:
                    workloads = await build_workloads(
                        plan, target.base_url, prompt_source, options.seed
                    )
                    console.print(
                        f"workload: {workloads[0].description} ({workloads[0].prompt_kind} prompts)"
                    )
                async with http_client() as client:
                    kernels = await server_kernels(client, target)
                done = len(results)
                if plan.sweep is not None:
                    async with http_client() as client:
                        results += await run_sweep(
                            client, target, workloads, options,
                            kind=plan.sweep.kind, burstiness=plan.sweep.burstiness,
                            max_concurrency=plan.sweep.max_concurrency, console=console,
                        )  # fmt: skip
                else:
                    results += await run_target(
                        target, list(zip(workloads, plan.loads, strict=True)), options, console,
                        rebuild=rebuilder(plan, target.base_url, prompt_source, options.seed),
                    )  # fmt: skip
                results[done:] = [replace(r, kernels=kernels) for r in results[done:]]
        except RuntimeError as e:  # a peer that doesn't start is skipped, not fatal
            note = f"{source.target.name}: {str(e).splitlines()[0]}"
            console.print(f"[red]skipped {note}")
            skipped.append(note)
    return results, workloads or [], skipped
