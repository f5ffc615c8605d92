"""How many batch lines may be in the engine at once: many while it serves no interactive
request, few while it does, so that interactive requests keep their latency (the scheduler
runs every admitted sequence each step: batch lines in flight slow every step)."""

from __future__ import annotations

import asyncio
import contextlib

from tokenmill.engine.async_llm import AsyncLLM
from tokenmill.server.batch.config import BatchConfig

_POLL_S = 0.05  # interactive load changes without telling: look again this often


class InFlightLimiter:
    def __init__(self, engine: AsyncLLM, config: BatchConfig) -> None:
        self.engine = engine
        self.config = config
        self.lines = 0  # batch lines holding a slot
        self.seqs = 0  # their sequences (n x prompts)
        self._released = asyncio.Event()

    def limit(self) -> int:
        interactive = self.engine.num_in_flight - self.seqs
        return self.config.max_in_flight if interactive <= 0 else self.config.busy_in_flight

    async def acquire(self, seqs: int, stop: asyncio.Event) -> bool:
        """Waits for a slot; False (no slot taken) when `stop` is set first."""
        while self.lines >= self.limit():
            if stop.is_set():
                return False
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), _POLL_S)
        if stop.is_set():
            return False
        self.lines += 1
        self.seqs += seqs
        return True

    def release(self, seqs: int) -> None:
        self.lines -= 1
        self.seqs -= seqs
        self._released.set()
