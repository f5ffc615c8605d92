"""Worker threads with a large stack, for native code that recurses as deep as its input
(grammar compilation): a deep input then needs memory, not a new process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

LARGE_STACK_BYTES = 256 << 20  # reserved address space; pages are touched only as used


class LargeStackExecutor:
    def __init__(self, max_workers: int = 2, stack_bytes: int = LARGE_STACK_BYTES) -> None:
        self.stack_bytes = stack_bytes
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="tokenmill-grammar")
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args) -> Future[T]:
        # The pool starts its threads inside submit(): the stack size applies to those.
        with self._lock:
            previous = threading.stack_size(self.stack_bytes)
            try:
                return self._pool.submit(fn, *args)
            finally:
                threading.stack_size(previous)

    def run(self, fn: Callable[..., T], *args) -> T:
        """Runs fn on a large-stack thread and waits (never call it from one of them)."""
        return self.submit(fn, *args).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
