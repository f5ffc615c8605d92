"""Snapshots a source's metrics every `interval_s` into a bounded ring (the last `keep_s`),
which the dashboard polls. Rates are taken over the last `rate_s`, percentiles over the last
`window_s`, from the raw readings kept that long (only those: a reading is the registry's
every series)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tokenmill.ui.readings import Reading

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Base:
    """An earlier reading and how long ago it was taken."""

    reading: Reading
    seconds: float


class Source(Protocol):
    def read(self) -> Reading: ...

    def sample(self, now: Reading, rate: Base | None, window: Base | None) -> dict[str, Any]:
        """One point of every chart, from this reading and earlier ones."""
        ...


@dataclass(frozen=True)
class SamplerConfig:
    interval_s: float = 1.0
    keep_s: float = 600.0
    rate_s: float = 5.0
    window_s: float = 60.0


class Sampler:
    def __init__(
        self,
        source: Source,
        config: SamplerConfig = SamplerConfig(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source = source
        self.config = config
        self.clock = clock
        self.samples: deque[dict[str, Any]] = deque(
            maxlen=max(1, math.ceil(config.keep_s / config.interval_s))
        )
        span = max(config.rate_s, config.window_s)
        self._raw: deque[tuple[float, Reading]] = deque(
            maxlen=math.ceil(span / config.interval_s) + 2
        )
        self._task: asyncio.Task | None = None

    def _base(self, now: float, seconds: float) -> Base | None:
        """The oldest kept reading no older than `seconds` (None: nothing earlier yet)."""
        slack = self.config.interval_s / 2
        for t, reading in self._raw:
            if now - t <= seconds + slack:
                return Base(reading, now - t) if now > t else None
        return None

    def tick(self) -> dict[str, Any]:
        now = self.clock()
        reading = self.source.read()
        point = self.source.sample(
            reading, self._base(now, self.config.rate_s), self._base(now, self.config.window_s)
        )
        sample = {"t": round(now, 3), **point}
        self._raw.append((now, reading))
        self.samples.append(sample)
        return sample

    def since(self, t: float | None) -> list[dict[str, Any]]:
        if t is None:
            return list(self.samples)
        return [s for s in self.samples if s["t"] > t]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # a dashboard gap, never a dead server
                logger.exception("ui sampler: a tick failed")
            await asyncio.sleep(self.config.interval_s)
