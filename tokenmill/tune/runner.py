"""One trial: `tokenmill serve` started with a configuration's flags, the workload run
against it by the benchmark harness in this process (so the server is a child and the CPU
probe tells its load from other processes'), the figures kept."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from rich.console import Console

from tokenmill.bench.config import Target
from tokenmill.bench.contention import BUSY_CORES
from tokenmill.bench.execute import RunOptions
from tokenmill.bench.peers import ServerSpec
from tokenmill.bench.plan import Plan
from tokenmill.bench.session import Source, run_session
from tokenmill.ports import PortPool, PortRange
from tokenmill.tune.space import Config, config_argv, config_key, launch_command
from tokenmill.tune.trials import Trial


@dataclass(frozen=True)
class TrialRunner:
    plan: Plan
    options: RunOptions
    model: str | None
    log_dir: Path
    console: Console
    endpoint: str = "completions"
    extra_serve_args: tuple[str, ...] = ()  # fixed for every trial (e.g. --num-threads)
    port_range: PortRange | None = None  # the trial servers' ports (a cluster's replicas too)

    @cached_property
    def ports(self) -> PortPool:
        return PortPool(self.port_range)

    def serve_argv(self, config: Config) -> list[str]:
        return [*self.extra_serve_args, *config_argv(config)]

    def server(self, config: Config) -> ServerSpec:
        """`tokenmill serve`, or `tokenmill cluster` (replicas + router) when the
        configuration asks for more than one replica."""
        name = f"trial-{config_key(config)}"
        command = launch_command(config)
        model = ["--model", self.model] if self.model else []
        # a cluster's replicas take their ports from the range too
        ports = ["--port-range", str(self.port_range)] if self.port_range else []
        argv = (
            sys.executable, "-m", "tokenmill.cli", command, "--host", "127.0.0.1",
            "--port", "{port}", *(ports if command == "cluster" else []), *model,
            *self.serve_argv(config),
        )  # fmt: skip
        return ServerSpec(name, argv)

    def run(self, config: Config, attempt: int = 1) -> Trial:
        server = self.server(config)
        source = Source(Target(server.name, "", endpoint=self.endpoint), server=server)
        results, _, skipped = asyncio.run(
            run_session(
                [source], self.plan, self.options, self.console, self.log_dir, ports=self.ports
            )
        )
        if not results:  # the server did not start with these flags
            note = skipped[0] if skipped else "no result"
            return Trial(config, 0.0, 0.0, 0.0, None, True, attempt, {"failed_to_start": note})
        result = results[0]
        s = result.summary
        attainment = s.slo_attainment
        if s.failed:  # a configuration that fails requests never meets an SLO
            attainment = 0.0
        figures = {
            "ttft_ms_p50": s.ttft_ms.median, "ttft_ms_p90": s.ttft_ms.p90,
            "ttft_ms_p99": s.ttft_ms.p99, "tpot_ms_p50": s.tpot_ms.median,
            "tpot_ms_p99": s.tpot_ms.p99, "completed": s.completed, "failed": s.failed,
            "duration_s": s.duration_s, "mean_concurrency": s.mean_concurrency,
        }  # fmt: skip
        background = result.background_cpu
        clean = background is None or background <= BUSY_CORES
        return Trial(
            config, s.per_user_output_throughput, s.output_throughput, attainment, background,
            clean, attempt, figures,
        )  # fmt: skip
