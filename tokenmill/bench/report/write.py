"""Writes everything for a session under the output dir and prints the console table."""

from __future__ import annotations

import resource
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console

from tokenmill.bench.execute import RunOptions
from tokenmill.bench.machine import machine_meta
from tokenmill.bench.report.files import write_results
from tokenmill.bench.report.html import write_html
from tokenmill.bench.report.tables import markdown_table, print_table
from tokenmill.bench.results import RunResult
from tokenmill.bench.session import Source
from tokenmill.bench.workloads import Workload


def session_meta(
    workloads: list[Workload],
    sources: list[Source],
    skipped: list[str],
    options: RunOptions,
    argv: list[str],
    baseline: str | None,
) -> dict[str, Any]:
    targets = []
    for s in sources:
        entry: dict[str, Any] = {"name": s.target.name, "endpoint": s.target.endpoint}
        if s.server is not None:
            entry["command"] = " ".join(s.server.argv)
        else:
            entry["base_url"] = s.target.base_url
        targets.append(entry)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        **machine_meta(),
        "client_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),  # this process only
        "argv": argv,
        "targets": targets,
        "skipped": skipped,
        "baseline": baseline,
        "workloads": [
            {"description": w.description, "requests": w.num_requests, "prompts": w.prompt_kind}
            for w in workloads
        ],
        "options": {k: v for k, v in asdict(options).items() if k != "progress"},
    }


def write_report(
    out_dir: Path,
    results: list[RunResult],
    workloads: list[Workload],
    sources: list[Source],
    skipped: list[str],
    options: RunOptions,
    console: Console,
    *,
    baseline: str | None = None,
    plots: bool = True,
    argv: list[str] | None = None,
) -> dict[str, Path]:
    meta = session_meta(workloads, sources, skipped, options, argv or [], baseline)
    print_table(results, console, baseline, title="tokenmill bench")
    paths = write_results(out_dir, results, meta, baseline)
    (out_dir / "results.md").write_text(markdown_table(results, baseline) + "\n")
    plot_paths = {}
    if plots:
        from tokenmill.bench.report.plots import write_plots

        plot_paths = write_plots(out_dir, results)
    paths["html"] = write_html(out_dir, results, meta, plot_paths, baseline)
    console.print(f"report: {paths['html']}  (JSON, CSV, per-request JSONL, plots in {out_dir})")
    return {**paths, **plot_paths}
