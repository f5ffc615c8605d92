"""Start-up profile: where a process's start-up time went, phase by phase.

Each phase runs from the end of the one before (the first from the moment the operating
system created the process), so the phases add up to the whole start-up. Times are wall
clock (time.time()), so the API process can place its engine core's phases on its own
time line. Logged at debug level as they end; `/server_info` reports the whole profile."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

logger = logging.getLogger("tokenmill.startup")


def process_start_time(pid: int | None = None) -> float | None:
    """Wall-clock time the process was created (Linux /proc, to the scheduler tick; None
    elsewhere): its age on the boot clock, subtracted from now."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat", "rb") as f:
            # the command name (field 2) may hold spaces: count from the last ')'
            fields = f.read().rsplit(b")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime, ticks
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.time() - max(0.0, age)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class StartupProfile:
    """`mark(name)` ends the phase called `name` now."""

    def __init__(self, process: str, origin: float | None = None) -> None:
        self.process = process
        # /proc has 10 ms ticks: never let the origin come after the first mark
        self.origin = min(origin or process_start_time() or time.time(), time.time())
        self._last = self.origin
        self.phases: list[tuple[str, float]] = []  # (name, seconds)
        # work on other threads, overlapped with the phases (not part of their sum)
        self.background: dict[str, float] = {}

    def mark(self, name: str) -> float:
        now = time.time()
        seconds = max(0.0, now - self._last)
        self.phases.append((name, seconds))
        self._last = now
        logger.debug("%s start-up: %s %.3f s (%.3f s since launch)", self.process, name,
                     seconds, now - self.origin)  # fmt: skip
        return seconds

    @property
    def total(self) -> float:
        return self._last - self.origin

    def to_dict(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "launched_at": round(self.origin, 3),
            "total_s": round(self.total, 3),
            "phases": [{"name": n, "seconds": round(s, 4)} for n, s in self.phases],
            "background": {n: round(s, 4) for n, s in self.background.items()},
        }
