"""Finished trials, one JSON line each, appended (and synced) as each finishes, so an
interrupted tune resumes where it stopped; a torn last line from a crash is ignored."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenmill.tune.frontier import Point
from tokenmill.tune.space import Config, config_key


@dataclass(frozen=True)
class Trial:
    config: Config
    per_user: float  # output tok/s per user
    total: float  # output tok/s
    slo_attainment: float | None
    background_cores: float | None  # other processes' CPU during the run (bench/contention)
    clean: bool
    attempt: int = 1  # which run of this configuration (the chosen one runs again)
    figures: dict[str, Any] = field(default_factory=dict)  # TTFT / TPOT percentiles ...

    @property
    def key(self) -> str:
        return config_key(self.config)

    def point(self) -> Point:
        return Point(self.key, self.per_user, self.total, self.slo_attainment, self.clean)


class TrialStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.trials: list[Trial] = []
        if self.path.exists():
            text = self.path.read_text()
            complete = text[: text.rfind("\n") + 1]
            if complete != text:  # a last line torn by a crash: cut, that trial runs again
                with open(self.path, "r+") as f:
                    f.truncate(len(complete.encode()))
            for line in complete.splitlines():
                try:
                    self.trials.append(Trial(**json.loads(line)))
                except (json.JSONDecodeError, TypeError):
                    continue  # not a trial (edited by hand?): skipped

    def add(self, trial: Trial) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(asdict(trial), sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.trials.append(trial)

    def attempts(self) -> dict[str, list[Trial]]:
        out: dict[str, list[Trial]] = {}
        for t in self.trials:
            out.setdefault(t.key, []).append(t)
        return out

    def measured(self) -> dict[str, Trial]:
        """Per configuration, its runs combined: median throughputs (of the runs on a clean
        machine, if any), the lowest SLO attainment, the last run's figures."""
        return {key: combined(runs) for key, runs in self.attempts().items()}


def combined(runs: list[Trial]) -> Trial:
    if len(runs) == 1:
        return runs[0]
    clean = [r for r in runs if r.clean] or runs
    attainments = [r.slo_attainment for r in runs if r.slo_attainment is not None]
    return replace(
        runs[-1],
        per_user=statistics.median(r.per_user for r in clean),
        total=statistics.median(r.total for r in clean),
        slo_attainment=min(attainments) if attainments else None,
        clean=any(r.clean for r in runs),
        attempt=len(runs),
    )
