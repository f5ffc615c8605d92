"""RunResult: one (target, workload, load) run with its records and summary."""

from __future__ import annotations

from dataclasses import dataclass

from tokenmill.bench.config import LoadSpec
from tokenmill.bench.metrics import RunSummary
from tokenmill.bench.record import RequestRecord


@dataclass(frozen=True)
class RunResult:
    target: str
    workload: str
    load: LoadSpec
    summary: RunSummary
    records: tuple[RequestRecord, ...]
    stage: str = ""  # sweep stage (synchronous, throughput, rate) or ""
    background_cpu: float | None = None  # cores used by other processes during the run
    attempt: int = 0  # > 0: rerun with fresh prompts after a busy attempt
    # the target's kernel switches in force (a tokenmill server's /server_info; None: a peer)
    kernels: dict | None = None

    @property
    def label(self) -> str:
        return f"{self.target} · {self.load.label}"
