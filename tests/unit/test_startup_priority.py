"""Start-up work at a lower priority: the calling thread only, Linux only."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from tokenmill import platform
from tokenmill.platform import run_at_low_priority


def nice_of(tid: int) -> int:
    with open(f"/proc/self/task/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_only_the_helper_thread_is_lowered_and_its_result_or_error_comes_back():
    main = threading.get_native_id()
    before = nice_of(main)
    if before >= 10:
        pytest.skip("the tests already run at nice >= 10")
    seen = run_at_low_priority(lambda: nice_of(threading.get_native_id()))
    assert seen == 10
    assert nice_of(main) == before
    with pytest.raises(ZeroDivisionError):
        run_at_low_priority(lambda: 1 / 0)


def test_elsewhere_nothing_is_reniced(monkeypatch):
    """On other systems a thread id is not a process id setpriority would accept safely."""
    monkeypatch.setattr(platform.sys, "platform", "darwin")
    monkeypatch.setattr(os, "setpriority", lambda *a: pytest.fail(f"setpriority{a}"))
    assert run_at_low_priority(lambda: 42) == 42
