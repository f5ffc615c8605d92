"""A benchmark plan: the workload and the loads to run it under (or a sweep)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tokenmill.bench.config import LoadSpec
from tokenmill.bench.sweep import SWEEP_STAGES_FIXED
from tokenmill.bench.workloads import WorkloadSpec


@dataclass(frozen=True)
class SweepSpec:
    rates: int = 4  # rates between synchronous and saturation
    kind: str = "constant"  # constant | poisson
    burstiness: float = 1.0
    max_concurrency: int | None = None


@dataclass(frozen=True)
class Plan:
    """Either fixed `loads` (one workload per load, `workloads[i]` for `loads[i]`) or a
    `sweep` (one workload per stage). Every run gets its own prompts (seeded per index) so
    no run warms the prefix cache for another; every target gets the same prompts."""

    workloads: tuple[WorkloadSpec, ...]
    loads: tuple[LoadSpec, ...] = ()
    sweep: SweepSpec | None = None

    def __post_init__(self) -> None:
        if self.sweep is None and len(self.loads) != len(self.workloads):
            raise ValueError("plan: one workload per load")
        if self.sweep is not None and len(self.workloads) != SWEEP_STAGES_FIXED + self.sweep.rates:
            raise ValueError("plan: one workload per sweep stage")

    @property
    def max_in_flight(self) -> int:
        caps = [int(load.concurrency or load.max_concurrency or 0) for load in self.loads]
        if self.sweep and self.sweep.max_concurrency:
            caps.append(self.sweep.max_concurrency)
        unbounded = self.sweep is not None or any(
            load.kind != "concurrency" and not load.max_concurrency for load in self.loads
        )
        most = max(caps, default=1)
        return max(most, max(w.num_requests for w in self.workloads)) if unbounded else most


def fixed_plan(spec: WorkloadSpec, loads: list[LoadSpec], num_requests: list[int]) -> Plan:
    """num_requests: one value for all loads, or one per load."""
    if len(num_requests) == 1:
        num_requests = num_requests * len(loads)
    if len(num_requests) != len(loads):
        raise ValueError(
            f"num-requests: {len(num_requests)} values for {len(loads)} loads (give 1 or one per load)"
        )
    return Plan(tuple(replace(spec, num_requests=n) for n in num_requests), tuple(loads))


def sweep_plan(spec: WorkloadSpec, sweep: SweepSpec) -> Plan:
    return Plan((spec,) * (SWEEP_STAGES_FIXED + sweep.rates), sweep=sweep)


def max_request_tokens(spec: WorkloadSpec) -> int:
    """Upper estimate of prompt + output tokens of one request (for sizing a peer's KV)."""

    def top(d) -> int:
        return int(d.b if d.kind == "uniform" else d.a + 4 * d.b if d.kind == "normal" else d.a)

    if spec.kind == "shared-prefix":
        return spec.prefix_len + spec.suffix_len + top(spec.output_len)
    if spec.kind == "multi-turn":
        return spec.turns * (top(spec.input_len) + top(spec.output_len))
    if spec.kind in ("jsonl", "trace"):
        return 2048
    return top(spec.input_len) + top(spec.output_len)
