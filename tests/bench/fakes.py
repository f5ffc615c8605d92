"""Fake senders and prompt makers for runner / workload tests (no server)."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from tokenmill.bench.client import Prepared
from tokenmill.bench.record import RequestRecord


class FakeMaker:
    """Text of n 'words' w<id>, exactly n tokens."""

    kind = "fake"

    async def make(self, rng: random.Random, n_tokens: int) -> tuple[str, int]:
        return " ".join(f"w{rng.randrange(10_000)}" for _ in range(n_tokens)), n_tokens


@dataclass
class FakeServer:
    """Answers after `service_s`; tracks requests in flight; fails turns listed in `fail`."""

    service_s: float = 0.05
    fail: set[tuple[int, int]] = field(default_factory=set)
    in_flight: int = 0
    max_in_flight: int = 0
    sent: list[Prepared] = field(default_factory=list)

    async def __call__(self, req: Prepared, t0: float) -> RequestRecord:
        start = time.perf_counter() - t0
        self.sent.append(req)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.service_s)
        finally:
            self.in_flight -= 1
        end = time.perf_counter() - t0
        ok = (req.session_id, req.turn) not in self.fail
        return RequestRecord(
            req.session_id, req.turn, req.scheduled_s, start, end, ok,
            error=None if ok else "HTTP 500: boom",
            chunk_times=(end,) if ok else (), chunk_tokens=(1,) if ok else (),
            output_tokens=1 if ok else None,
            text=f"reply-{req.session_id}-{req.turn}",
        )  # fmt: skip
