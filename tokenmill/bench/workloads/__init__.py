"""Workloads: random, shared-prefix, multi-turn, JSONL prompts, trace replay."""

from __future__ import annotations

from tokenmill.bench.prompts import PromptMaker
from tokenmill.bench.workloads.base import Session, Turn, Workload, WorkloadSpec
from tokenmill.bench.workloads.files import jsonl_workload, trace_workload
from tokenmill.bench.workloads.synthetic import (
    multi_turn_workload,
    random_workload,
    shared_prefix_workload,
)

__all__ = ["Session", "Turn", "Workload", "WorkloadSpec", "build_workload"]


async def build_workload(spec: WorkloadSpec, maker: PromptMaker, seed: int) -> Workload:
    if spec.kind == "random":
        return await random_workload(spec, maker, seed)
    if spec.kind == "shared-prefix":
        return await shared_prefix_workload(spec, maker, seed)
    if spec.kind == "multi-turn":
        return await multi_turn_workload(spec, maker, seed)
    if spec.kind == "jsonl":
        return jsonl_workload(spec, seed)
    return await trace_workload(spec, maker, seed)
