"""Facts about the machine tokenmill runs on, and how its threads share it: the CPU's
name (keys measurements stored per machine) and lower OS priorities for work that must
yield to the critical path."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def lower_thread_priority(nice: int = 10) -> None:
    """Work off the critical path yields to it: a higher nice value for the calling thread
    only (Linux schedules threads; threads it starts inherit the value, so call it on a
    thread that ends with its work or serves only such work). Elsewhere, or refused:
    nothing."""
    if not sys.platform.startswith("linux"):  # elsewhere the id would name a process
        return
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


def run_at_low_priority(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) on a new thread at a lower priority (lower_thread_priority), the caller
    waiting; its exception is raised here."""
    result: list = []

    def run() -> None:
        lower_thread_priority()
        try:
            result.append((True, fn(*args)))
        except BaseException as e:  # re-raised in the caller
            result.append((False, e))

    thread = threading.Thread(target=run, name="start-up")
    thread.start()
    thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str) -> str:
    """--device: "auto" is cuda where torch sees a GPU, else cpu; "cuda" without one is an
    error (never a silent fall-back to the CPU)."""
    if device not in DEVICES:
        raise ValueError(f"device: unknown value {device!r} (one of {', '.join(DEVICES)})")
    if device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if device == "cuda":
        raise ValueError("device: 'cuda' asked for, but torch sees no CUDA device here")
    return "cpu"
