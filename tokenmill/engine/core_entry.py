"""The engine-core process's entry points, importable without the engine: the API process
names one as the target of the process it starts; only the child imports the engine.

`run_engine_core` gets its arguments when it starts. `EarlyEngineCore` is forked before
`tokenmill serve` parses its arguments: the child imports torch and the engine at once and
takes its arguments through a pipe when the parent has them (the import is most of the
engine's start-up, and does not depend on them)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

# The API process stops the engine core with this signal, and it is the core's parent-death
# signal too. SIGTERM and SIGINT, which a terminal or a service manager sends to the whole
# process group, leave the stop to the API process, which drains its requests first.
STOP_SIGNAL = signal.SIGUSR2


def _start_prefetch(config: Any):
    """Native weights prepared on a thread while the process imports torch; never fatal
    (without it the engine builds everything itself)."""
    try:
        from tokenmill.model.prefetch import start_prefetch

        return start_prefetch(config)
    except Exception:
        logger.debug("no start-up prefetch", exc_info=True)
        return None


def exit_with_parent(parent: int) -> None:
    """Ends this process when the API process (`parent`, its pid as the parent saw it)
    dies, from the first moment (the imports take a second): the kernel signals it (Linux),
    and a watchdog thread checks the parent id elsewhere or if that is missed. Signals meant
    for the process group are the API process's to act on."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, STOP_SIGNAL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                logger.error("the API process is gone: exiting")
                os._exit(1)
            time.sleep(1.0)

    if os.getppid() != parent:  # died before prctl took effect
        os._exit(1)
    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def run_engine_core(*args: Any, parent: int) -> None:
    """(config, input address, output address, log level); `parent`: the API process."""
    exit_with_parent(parent)
    from tokenmill.engine.startup import StartupProfile

    profile = StartupProfile("engine-core")  # from the moment the process was created
    profile.mark("spawn")
    prefetch = _start_prefetch(args[0])
    from tokenmill.engine.core_proc import run_engine_core as run

    profile.mark("imports")
    _stop_on_signal()
    run(*args, profile=profile, prefetch=prefetch)


def _run_early(reader, writer, parent: int) -> None:
    exit_with_parent(parent)
    from tokenmill.engine.startup import StartupProfile

    profile = StartupProfile("engine-core")
    profile.mark("spawn")
    writer.close()  # the parent's end: its close (or the parent's exit) is our EOF
    got: dict[str, Any] = {}

    def receive() -> None:  # the arguments arrive while the main thread imports
        try:
            got["args"] = reader.recv()
        except (EOFError, OSError):
            return
        got["prefetch"] = _start_prefetch(got["args"][0])

    thread = threading.Thread(target=receive, name="engine-core-arguments", daemon=True)
    thread.start()
    from tokenmill.engine.core_proc import run_engine_core as run

    thread.join()
    if "args" not in got:  # the server did not start (bad arguments, --help, an error)
        os._exit(0)
    profile.mark("imports")
    _stop_on_signal()
    run(*got["args"], profile=profile, prefetch=got["prefetch"])


def _stop_on_signal() -> None:
    """STOP_SIGNAL unwinds the engine (its KV event sockets close) instead of killing it."""
    signal.signal(STOP_SIGNAL, lambda *_: sys.exit(0))


class EarlyEngineCore:
    """An engine-core process forked before the server has its arguments (only from a
    process with no threads yet). `start(...)` hands them over; a parent that never does
    (it failed, or printed help) cancels it, or closes the pipe by exiting."""

    def __init__(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        reader, self._writer = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=_run_early, args=(reader, self._writer, os.getpid()),
            name="tokenmill-engine-core", daemon=True,
        )  # fmt: skip
        self.proc.start()
        reader.close()

    def start(self, *args: Any) -> None:
        """(config, input address, output address, log level), as run_engine_core's."""
        self._writer.send(args)
        self._writer.close()

    def cancel(self) -> None:
        """Not needed after all (the server did not start): stops the child."""
        if not self._writer.closed:
            self._writer.close()
            os.kill(self.proc.pid, STOP_SIGNAL)
            self.proc.join(5.0)
