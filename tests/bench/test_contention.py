"""Background CPU probe: the harness's own process tree is counted as its own."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tokenmill.bench.contention import CpuProbe, _tree_busy_s


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_descendants_count_as_own_cpu():
    spin = "import time\nt = time.time()\nwhile time.time() - t < 3: pass"
    child = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)
        probe = CpuProbe().start()
        own0, child0 = _tree_busy_s(os.getpid()), _tree_busy_s(child.pid)
        time.sleep(1.0)
        own1, child1 = _tree_busy_s(os.getpid()), _tree_busy_s(child.pid)
        cores = probe.cores()
    finally:
        child.kill()
        child.wait()
    assert child1 - child0 > 0.2  # the child spun (even on a shared machine)
    assert own1 - own0 >= child1 - child0 - 0.05  # and it is part of our tree
    assert cores is not None and cores >= 0.0
