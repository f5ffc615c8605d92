"""Request-driven CPU work (tokenization, chat templates; large bodies while the parse
process starts) off the event loop, on a pool of two threads. Threads still share the GIL
with the loop, and C code holds it for its whole call: with many such threads the loop
waits for each in turn, with two it gets the GIL back within one call. Two, not one, so a
single huge prompt does not hold up everyone else's tokenization. They run at the normal
priority: threads they start (a tokenizer's own pool) would inherit a lower one."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenmill-cpu")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` on the pool (with the caller's context variables, as asyncio.to_thread)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_POOL, call)
