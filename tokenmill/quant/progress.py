"""Progress of `quant eval` and `quant search` on stderr: each step (load, score a plan,
calibrate, time decode) as it starts, then its count at most every `interval_s`, each line
with the time since the command started. Minutes of scoring with nothing on screen read as
a hang."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    def __init__(
        self,
        stream: TextIO | None = None,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        enabled: bool = True,
    ) -> None:
        self.stream = stream
        self.interval_s = interval_s
        self.clock = clock
        self.enabled = enabled
        self.started = clock()
        self._last = -math.inf  # when the last line was written
        self._label, self._unit = "", ""
        self._done = self._total = 0

    def begin(self, label: str, total: int = 0, unit: str = "") -> None:
        """A step starts (written at once); with `total`, `advance` counts its units."""
        self._label, self._unit, self._done, self._total = label, unit, 0, total
        self._write(f"{label} ({total} {unit})" if total else label)

    def advance(self, n: int = 1) -> None:
        """`n` more units of the step done; their count is written at most every
        `interval_s`."""
        self._done += n
        if self.clock() - self._last >= self.interval_s:
            self._write(f"{self._label}: {self._done}/{self._total} {self._unit}")

    def _write(self, text: str) -> None:
        if not self.enabled:
            return
        now = self.clock()
        self._last = now
        stream = self.stream if self.stream is not None else sys.stderr
        print(f"[{now - self.started:7.1f}s] {text}", file=stream, flush=True)
