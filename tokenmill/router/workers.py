"""CPU work off the router's event loop (rendering, tokenizing and hashing prompts), so a
multi-MB prompt does not stall every other stream, bounded so a flood cannot pile it up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class CPUWorkers:
    """At most `threads` jobs run at once; callers wait for a slot in line. A slot frees only
    when its job ends, even if its caller was cancelled meanwhile (a thread cannot be
    stopped), so cancelled requests cannot leave work queued behind the limit."""

    def __init__(self, threads: int) -> None:
        self._slots = asyncio.Semaphore(threads)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="router-cpu")

    async def run(self, fn: Callable[[], T]) -> T:
        await self._slots.acquire()
        try:
            job = asyncio.get_running_loop().run_in_executor(self._pool, fn)
        except BaseException:
            self._slots.release()
            raise
        job.add_done_callback(self._done)
        return await asyncio.shield(job)

    def _done(self, job: asyncio.Future) -> None:
        self._slots.release()
        if not job.cancelled():
            job.exception()  # retrieved: a caller that left must not make asyncio log it

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
