"""Large bodies are parsed in a process of the server's own (server/parse_process.py): the
same answers as in the API process, a dead worker replaced, and no worker left behind
when the server is killed."""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from tests.server.conftest import MODEL, start_server


def workers_of(pid: int) -> list[int]:
    """The parse workers among `pid`'s children (spawned: `multiprocessing.spawn` argv)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if ppid == pid and b"multiprocessing.spawn" in argv:
            out.append(int(entry))
    return out


def until(check, seconds: float = 30.0):
    deadline = time.monotonic() + seconds
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return value


def parser_info(srv) -> dict:
    return httpx.get(f"{srv.base_url}/server_info", timeout=30).json()["parse_process"]


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_large_bodies_in_a_worker_answer_the_same_and_leave_no_orphan(tmp_path):
    srv = start_server(tmp_path)
    try:
        assert parser_info(srv)["state"] == "off"  # started by the first large body
        big_ok = {"model": MODEL, "prompt": "word " * 20_000, "max_tokens": 1}
        too_long = httpx.post(f"{srv.v1}/completions", json=big_ok, timeout=60)
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "prompt"
        worker = until(lambda: parser_info(srv)["pid"])
        assert workers_of(srv.proc.pid) == [worker]
        short = {"model": MODEL, "prompt": list(range(20, 30)), "max_tokens": 2, "ignore_eos": True,
                 "temperature": 0, "logit_bias": {str(i): 0.0 for i in range(2000)},
                 "stop": ["x" * 1000] * 16}  # fmt: skip
        filler = {"x_unknown_field": "y" * 70_000}  # ignored, and makes the body large
        for body in ({**short, **filler}, short):
            r = httpx.post(f"{srv.v1}/completions", json=body, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
        bad = {"model": MODEL, "prompt": [-1] * 100_000}
        err = httpx.post(f"{srv.v1}/completions", json=bad, timeout=60).json()["error"]
        assert err["param"] == "prompt.0" and err["type"] == "invalid_request_error"
        os.kill(worker, signal.SIGKILL)  # answered anyway, and a new worker takes over
        err = httpx.post(f"{srv.v1}/completions", json=bad, timeout=60).json()["error"]
        assert err["param"] == "prompt.0"

        def replaced() -> int | None:
            httpx.post(f"{srv.v1}/completions", json=bad, timeout=60)  # starts one if needed
            pid = parser_info(srv)["pid"]
            return pid if pid not in (None, worker) else None

        new = until(replaced)
        assert parser_info(srv)["starts"] == 2
        os.kill(srv.proc.pid, signal.SIGKILL)  # no shutdown: the worker must go by itself
        srv.proc.wait()
        until(lambda: not os.path.exists(f"/proc/{new}"), 10)
    finally:
        srv.stop()
