"""Background CPU probe: the harness's own process tree is counted as its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tokenmill.bench.contention import CpuProbe, _machine_busy_s, _tree_busy_s


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_descendants_count_as_own_cpu():
    spin = "import time\nt = time.time()\nwhile time.time() - t < 3: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)
        probe = CpuProbe().start()
        t0, machine0 = time.monotonic(), _machine_busy_s()
        own0, child0 = _tree_busy_s(os.getpid()), _tree_busy_s(child.pid)
        time.sleep(1.0)
        own1, child1 = _tree_busy_s(os.getpid()), _tree_busy_s(child.pid)
        cores = probe.cores()
        t1, machine1 = time.monotonic(), _machine_busy_s()
    finally:
        child.kill()
        child.wait()
    assert child1 - child0 > 0.2  # the child spun (even on a shared machine)
    assert own1 - own0 >= child1 - child0 - 0.05  # and it is part of our tree
    # what the probe calls background is the machine's busy time minus our own tree's
    assert cores is not None and machine0 is not None and machine1 is not None
    machine_cores = (machine1 - machine0) / (t1 - t0)
    own_cores = (own1 - own0) / (t1 - t0)
    assert cores <= max(0.0, machine_cores - own_cores) + 0.15, (cores, machine_cores, own_cores)
