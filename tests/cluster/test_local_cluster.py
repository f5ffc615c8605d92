"""The local launcher behind the same interface: `tokenmill cluster` (no Ray) scales under
load without losing a request, and a worker's server dies with its parent (no orphans)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.cluster.harness import (
    assert_matches_reference,
    reference_outputs,
    start_tokenmill_cluster,
    under_load,
)


def gone(pid: int) -> bool:
    """Exited (a zombie until its new parent reaps it counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_server_started_through_exec_with_parent_dies_with_its_parent():
    """The wrapper execs (same pid) with PR_SET_PDEATHSIG: SIGKILL the starter, and the
    child goes too, as a Ray actor's server does when the actor is killed."""
    starter = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-m', 'tokenmill.cluster.exec_with_parent',"
        " '/bin/sleep', '60'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # exec'd: the pid is now sleep's
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if f.read().startswith(b"/bin/sleep"):
                    break
            time.sleep(0.05)
        assert not gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child), "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if child is not None and not gone(child):  # the test failed: no orphan either
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_local_cluster_scales_1_2_1_under_load(tmp_path):
    reference = reference_outputs(tmp_path)
    c = start_tokenmill_cluster(["--replicas", "1", "--num-threads", "1"], tmp_path, reference, 1)
    try:
        assert [w["node"] for w in c.workers()] == ["local"]

        def one_two_one() -> None:
            c.scale(2)
            time.sleep(2.0)
            c.scale(1)

        outcomes = under_load(c, one_two_one, settle_s=2.0)
        bad = [o for o in outcomes if not o.ok]
        assert not bad, bad
        assert len({o.replica for o in outcomes}) == 2  # the added replica served too
        assert_matches_reference(c, outcomes)
        assert "draining (" in c.log()
    finally:
        assert c.stop() == 0, c.log()[-3000:]
