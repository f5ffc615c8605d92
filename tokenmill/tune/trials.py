"""Finished trials, one JSON line each, appended (and synced) as each finishes, so an
interrupted tune resumes where it stopped; a torn last line from a crash is ignored."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
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
    attempt: int = 1  # > 1: re-run because the machine was busy
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

    def latest(self) -> dict[str, Trial]:
        """Per configuration, its last attempt."""
        out: dict[str, Trial] = {}
        for t in self.trials:
            out[t.key] = t
        return out
