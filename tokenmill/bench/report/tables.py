"""Console (rich) and markdown tables of results, with ratio rows against a baseline."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tokenmill.bench.report.rows import (
    COLUMNS,
    RATIO_KEYS,
    fmt,
    ratio_rows,
    result_row,
    scenario,
)
from tokenmill.bench.results import RunResult

_HEADERS = dict((k, h) for k, h, _ in COLUMNS)
BUSY_CORES = 0.25


def _result_cells(r: RunResult) -> list[str]:
    row = result_row(r)
    return [fmt(row[k], f) for k, _, f in COLUMNS]


def _ratio_cells(row: dict[str, Any]) -> list[str]:
    return [fmt(row.get(k), "{:.2f}x") if k in RATIO_KEYS else "" for k, _, _ in COLUMNS]


def table_rows(results: list[RunResult], baseline: str | None) -> list[tuple[str, str, list[str]]]:
    """(scenario, row label, cells): each scenario's targets, then its ratio rows."""
    ratios = ratio_rows(results, baseline) if baseline else []
    out: list[tuple[str, str, list[str]]] = []
    seen: list[str] = []
    for r in results:
        if scenario(r) not in seen:
            seen.append(scenario(r))
    for scen in seen:
        for r in results:
            if scenario(r) == scen:
                out.append((scen, r.target, _result_cells(r)))
        for row in ratios:
            if row["scenario"] == scen:
                out.append((scen, row["ratio"], _ratio_cells(row)))
    return out


def print_table(
    results: list[RunResult], console: Console, baseline: str | None = None, title: str = ""
) -> None:
    table = Table(title=title or None, show_lines=False)
    table.add_column("scenario", no_wrap=True)
    table.add_column("target", no_wrap=True)
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    last = None
    for scen, label, cells in table_rows(results, baseline):
        if last is not None and scen != last:
            table.add_section()
        style = "italic cyan" if " / " in label else None
        table.add_row(scen if scen != last else "", label, *cells, style=style)
        last = scen
    console.print(table)
    for r in results:
        if r.summary.errors:
            console.print(f"[red]{r.label}: errors {r.summary.errors}")
    for r in busy_runs(results):
        console.print(
            f"[yellow]{r.label}: other processes used {r.background_cpu:.2f} CPU cores "
            "during the run; its numbers are not clean"
        )


def busy_runs(results: list[RunResult], threshold: float = BUSY_CORES) -> list[RunResult]:
    """Runs during which other processes used more than `threshold` cores."""
    return [r for r in results if (getattr(r, "background_cpu", None) or 0.0) > threshold]


def markdown_table(results: list[RunResult], baseline: str | None = None) -> str:
    headers = ["scenario", "target", *(h for _, h, _ in COLUMNS)]
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join(["---", "---"] + ["---:"] * len(COLUMNS)) + " |",
    ]
    last = None
    for scen, label, cells in table_rows(results, baseline):
        name = f"**{label}**" if " / " in label else label
        lines.append("| " + " | ".join([scen if scen != last else "", name, *cells]) + " |")
        last = scen
    return "\n".join(lines)
