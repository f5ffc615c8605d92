"""Workloads read from files: a JSONL of prompts, a recorded trace to replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenmill.bench.prompts import PromptMaker
from tokenmill.bench.workloads.base import (
    Session,
    Turn,
    Workload,
    WorkloadSpec,
    gather_limited,
    sub_rng,
)


def _lines(path: str) -> list[Any]:
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"dataset: {path}:{n}: {e}") from e
    if not rows:
        raise ValueError(f"dataset: {path} has no rows")
    return rows


def jsonl_workload(spec: WorkloadSpec, seed: int) -> Workload:
    """Rows: a string, {"prompt": str}, or {"messages": [...]}; optional "max_tokens" /
    "output_len" (else --output-len is sampled). Up to num_requests rows, cycled if fewer.
    Input lengths are unknown here (0); the server's usage reports them."""
    rows = _lines(str(spec.path))
    outs = spec.output_len.sample(sub_rng(seed, 0), spec.num_requests)
    sessions = []
    for i in range(spec.num_requests):
        row = rows[i % len(rows)]
        if isinstance(row, str):
            row = {"prompt": row}
        out = int(row.get("max_tokens") or row.get("output_len") or outs[i])
        if "messages" in row:
            msgs = tuple(row["messages"])
            if not msgs or msgs[-1].get("role") != "user":
                raise ValueError(f"dataset: row {i + 1}: messages must end with a user turn")
            turn = Turn(str(msgs[-1]["content"]), 0, out, context=msgs[:-1])
        elif "prompt" in row:
            turn = Turn(str(row["prompt"]), 0, out)
        else:
            raise ValueError(f"dataset: row {i + 1} has neither prompt nor messages")
        sessions.append(Session(i, (turn,)))
    return Workload("jsonl", tuple(sessions), "file", spec.describe())


async def trace_workload(spec: WorkloadSpec, maker: PromptMaker, seed: int) -> Workload:
    """Rows {"timestamp", "input_length", "output_length"} (Mooncake-style field names;
    `timestamp` in --trace-time-unit, shifted to start at 0 and divided by --trace-speedup).
    Prompts of each input length are generated; the first num_requests rows are replayed."""
    rows = _lines(str(spec.path))[: spec.num_requests]
    scale = 1e-3 if spec.trace_time_unit == "ms" else 1.0
    try:
        stamps = [float(r["timestamp"]) * scale for r in rows]
        ins = [int(r["input_length"]) for r in rows]
        outs = [int(r["output_length"]) for r in rows]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"dataset: trace rows need timestamp, input_length, output_length ({e})"
        ) from e
    t0 = min(stamps)
    made = await gather_limited(
        [(lambda i=i: maker.make(sub_rng(seed, 6, i), ins[i])) for i in range(len(rows))]
    )
    sessions = tuple(
        Session(
            i,
            (Turn(made[i][0], made[i][1], outs[i]),),
            arrival_s=(stamps[i] - t0) / spec.trace_speedup,
        )
        for i in range(len(rows))
    )
    return Workload("trace", sessions, maker.kind, spec.describe())
