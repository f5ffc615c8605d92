"""Large request bodies parsed in a process of their own. A thread would share the API
process's GIL, and the JSON decoder, the checks and pydantic hold it for milliseconds at a
time: eight 390 KiB bodies of bad token ids at once stalled every stream by 0.1-0.2 s.
In another process their cost is a pipe write and, for a good body, unpickling the model.

One worker, started with the first large body (that body and those arriving while it
starts are parsed on the CPU pool, as are all bodies if it cannot start), at a lower OS
priority than the engine core, killed with the API process (Linux: PR_SET_PDEATHSIG)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from pydantic import BaseModel

from tokenmill.server.errors import APIError
from tokenmill.server.json_body import parse_model
from tokenmill.server.protocol import DetokenizeRequest

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _init_worker(parent: int) -> None:
    # signals to the whole process group (a service manager's stop, Ctrl-C) are the API
    # process's: it drains, then closes the pool
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the pipe's EOF ends it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, 0, 10)
    if os.getppid() != parent:  # the API process died before prctl took effect
        os._exit(1)
    import tokenmill.server.protocol  # noqa: F401  (the models, imported once)


def _parse_here(body: bytes, model: type[BaseModel]) -> tuple[Any, ...]:
    """("ok", model instance) or ("error", APIError's fields): exceptions do not pickle."""
    try:
        return ("ok", parse_model(body, model))
    except APIError as e:
        return ("error", e.status, e.message, e.type, e.param, e.code)


# starts in a server's life (a worker that dies is replaced; one that keeps dying is not)
MAX_STARTS = 16


class ParseProcess:
    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None
        self._ready = False
        self._starting: asyncio.Task | None = None
        self._starts = 0

    @property
    def ready(self) -> bool:
        return self._ready

    def info(self) -> dict[str, Any]:
        """For /server_info: off (no large body yet), starting, ready or failed."""
        if self._ready:
            state = "ready"
        elif self._starting is not None:
            state = "starting"
        else:
            state = "failed" if self._starts >= MAX_STARTS else "off"
        procs = list(getattr(self._pool, "_processes", None) or {})
        return {"state": state, "pid": procs[0] if procs and self._ready else None,
                "starts": self._starts}  # fmt: skip

    def start(self) -> None:
        """Starts a worker in the background (one at a time); `ready` says when it can take
        work."""
        if self._starting is not None or self._ready or self._starts >= MAX_STARTS:
            return
        self._starts += 1
        self._starting = asyncio.get_running_loop().create_task(self._start())

    async def _start(self) -> None:
        try:
            # spawn: the API process has threads, and a forked copy of their locks could hang
            self._pool = pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
            # the worker is spawned by this (the event loop's) thread, which lives as long
            # as the server: PDEATHSIG fires when the thread that forked it ends
            warm = pool.submit(_parse_here, b'{"tokens": []}', DetokenizeRequest)
            await asyncio.wrap_future(warm)
        except Exception:  # killed while starting, or no process at all: tried again later
            logger.warning(
                "parse process did not start (%d of %d starts); large bodies are parsed in the "
                "API process meanwhile", self._starts, MAX_STARTS, exc_info=True,
            )  # fmt: skip
            self._discard()
            return
        self._ready, self._starting = True, None

    def _discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool, self._ready, self._starting = None, False, None

    async def parse(self, body: bytes, model: type[BaseModel]) -> Any:
        assert self._pool is not None
        try:
            result = await asyncio.wrap_future(self._pool.submit(_parse_here, body, model))
        except BrokenProcessPool:  # the worker died (killed, out of memory): start another
            self._discard()
            raise
        if result[0] == "ok":
            return result[1]
        raise APIError(*result[1:])

    def close(self) -> None:
        if self._starting is not None:
            self._starting.cancel()
        self._discard()
