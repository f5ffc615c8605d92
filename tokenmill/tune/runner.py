"""One trial: `tokenmill serve` started with a configuration's flags, the workload run
against it by the benchmark harness in this process (so the server is a child and the CPU
probe tells its load from other processes'), the figures kept."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from tokenmill.bench.config import Target
from tokenmill.bench.contention import BUSY_CORES
from tokenmill.bench.execute import RunOptions
from tokenmill.bench.peers import ServerSpec
from tokenmill.bench.plan import Plan
from tokenmill.bench.session import Source, run_session
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

    def serve_argv(self, config: Config) -> list[str]:
        return [*self.extra_serve_args, *config_argv(config)]

    def run(self, config: Config, attempt: int = 1) -> Trial:
        """A trial on `tokenmill serve`, or on `tokenmill cluster` (replicas + router) when
        the configuration asks for more than one replica."""
        name = f"trial-{config_key(config)}"
        model = ["--model", self.model] if self.model else []
        argv = (
            sys.executable, "-m", "tokenmill.cli", launch_command(config), "--host",
            "127.0.0.1", "--port", "{port}", *model, *self.serve_argv(config),
        )  # fmt: skip
        source = Source(Target(name, "", endpoint=self.endpoint), server=ServerSpec(name, argv))
        results, _, skipped = asyncio.run(
            run_session([source], self.plan, self.options, self.console, self.log_dir)
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
