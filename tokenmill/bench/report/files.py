"""results.json (meta + summaries), results.csv (one row per run), requests.jsonl."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tokenmill.bench.report.rows import ratio_rows, result_row
from tokenmill.bench.results import RunResult


def _clean(value: Any) -> Any:
    """NaN / inf become null so the JSON is standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def results_document(
    results: list[RunResult], meta: dict[str, Any], baseline: str | None
) -> dict[str, Any]:
    return _clean(
        {
            "meta": meta,
            "runs": [
                {
                    "target": r.target,
                    "workload": r.workload,
                    "stage": r.stage,
                    "load": {**asdict(r.load), "label": r.load.label},
                    "background_cpu_cores": getattr(r, "background_cpu", None),
                    "attempt": getattr(r, "attempt", 0),
                    "kernels": getattr(r, "kernels", None),
                    "summary": asdict(r.summary),
                }
                for r in results
            ],
            "ratios": ratio_rows(results, baseline) if baseline else [],
        }
    )


def write_results(
    out_dir: Path, results: list[RunResult], meta: dict[str, Any], baseline: str | None = None
) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "requests": out_dir / "requests.jsonl",
    }
    doc = results_document(results, meta, baseline)
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    rows = [result_row(r) for r in results]
    with paths["csv"].open("w", newline="") as f:
        if rows:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    with paths["requests"].open("w") as f:
        for r in results:
            for rec in r.records:
                row = {"target": r.target, "load": r.load.label, "stage": r.stage, **asdict(rec)}
                row.pop("text", None)
                f.write(json.dumps(_clean(row)) + "\n")
    return paths
