"""CPU used by other processes while a run was measured (Linux /proc; None elsewhere).

On a shared machine a benchmark of CPU servers is only meaningful when nothing else runs:
this samples the machine's busy CPU time and that of this process and its descendants
(the servers the harness started) and reports the difference, in cores, averaged over
the run. Servers started elsewhere (--peer, --base-url) count as background.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
BUSY_CORES = 0.25  # a run with more background CPU than this is not clean


def _machine_busy_s() -> float | None:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    ticks = [int(x) for x in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    guest = sum(ticks[8:10]) if len(ticks) > 9 else 0  # already counted in user/nice
    return (sum(ticks) - idle - guest) / _TICK


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in task.read_text().split()]
    return out


def _tree_busy_s(root: int) -> float:
    total, stack, seen = 0.0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
        stack += _children(pid)
    return total


@dataclass
class CpuProbe:
    """start() before a run, cores() after it: mean cores used by other processes."""

    machine0: float | None = None
    own0: float = 0.0
    t0: float = 0.0

    def start(self) -> CpuProbe:
        self.machine0 = _machine_busy_s()
        self.own0 = _tree_busy_s(os.getpid())
        self.t0 = time.monotonic()
        return self

    def cores(self) -> float | None:
        machine = _machine_busy_s()
        if machine is None or self.machine0 is None:
            return None
        elapsed = time.monotonic() - self.t0
        if elapsed <= 0:
            return None
        # descendants that exited during the run are lost from the tree; the servers don't
        own = _tree_busy_s(os.getpid()) - self.own0
        return max(0.0, (machine - self.machine0 - own) / elapsed)


async def wait_until_idle(
    timeout_s: float, threshold: float = BUSY_CORES, window_s: float = 3.0, log=None
) -> float | None:
    """Waits until other processes use under `threshold` cores over a `window_s` window,
    for at most `timeout_s`. Returns the last measurement (None where /proc is missing)."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    waited = False
    while True:
        probe = CpuProbe().start()
        await asyncio.sleep(window_s)
        cores = probe.cores()
        if cores is None or cores < threshold or time.monotonic() >= deadline:
            if waited and log:
                log(f"background CPU {cores:.2f} cores; going on" if cores is not None else "")
            return cores
        if not waited and log:
            log(f"waiting for other processes to go idle ({cores:.2f} cores busy) ...")
        waited = True
