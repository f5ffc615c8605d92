"""Disconnects free KV blocks; SIGTERM drains; an engine-core crash fails requests cleanly;
a full queue answers 503 with Retry-After; API keys."""

from __future__ import annotations

import concurrent.futures as cf
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL, start_server


def metric(server, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def metric_sum(server, name: str) -> float:
    """A labelled metric summed over its labels."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def stream_body(max_tokens: int = 2000) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
    }


def test_disconnect_frees_blocks(server):
    assert wait_for(lambda: metric(server, "tokenmill:num_requests_running") == 0)
    idle_usage = metric(server, "tokenmill:kv_cache_usage_perc")
    got_tokens = threading.Barrier(9, timeout=120)

    def drop_midway() -> int:
        chunks = 0
        with httpx.stream(
            "POST", f"{server.v1}/chat/completions", json=stream_body(), timeout=120
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks += 1
                if chunks == 5:
                    got_tokens.wait()
                    break  # closing the response drops the connection mid-stream
        return chunks

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(drop_midway) for _ in range(8)]
        got_tokens.wait()
        assert metric(server, "tokenmill:num_requests_running") > 0
        assert all(f.result() == 5 for f in futures)
    assert wait_for(lambda: metric(server, "tokenmill:num_requests_running") == 0), (
        "aborted requests still running"
    )
    assert wait_for(lambda: metric(server, "tokenmill:kv_cache_usage_perc") == idle_usage), (
        "KV blocks not freed"
    )
    # the server still answers, and counts it
    done = metric_sum(server, "tokenmill:request_success_total")
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{server.v1}/chat/completions", json=body, timeout=60).status_code == 200
    assert wait_for(lambda: metric_sum(server, "tokenmill:request_success_total") == done + 1)


def test_non_streaming_disconnect_aborts(server):
    body = {**stream_body(), "stream": False}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.v1}/chat/completions", json=body, timeout=2.0)
    assert wait_for(lambda: metric(server, "tokenmill:num_requests_running") == 0), (
        "request kept running"
    )


@pytest.mark.parametrize("group", [False, True], ids=["api-process", "process-group"])
def test_sigterm_drains_in_flight_then_exits_zero(tmp_path, group):
    """SIGTERM to the API process, or to the whole process group as a service manager or a
    terminal sends it (the engine core gets SIGTERM and SIGINT too): the drain finishes the
    request in flight, and the stop logs no error."""
    srv = start_server(tmp_path, "--drain-timeout", "60")
    try:
        _drain_under_sigterm(srv, group)
    finally:  # a failed check leaves no server behind (its engine core goes with it)
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait(30)


def _drain_under_sigterm(srv, group: bool) -> None:
    if group:  # a large body starts the body-parsing worker
        filler = {"model": MODEL, "prompt": "hi", "max_tokens": 1, "x_unknown_field": "y" * 70_000}
        assert httpx.post(f"{srv.v1}/completions", json=filler, timeout=60).status_code == 200
        info = lambda: httpx.get(f"{srv.base_url}/server_info").json()  # noqa: E731
        assert wait_for(lambda: info()["parse_process"]["state"] == "ready", 30), info()
    results: list[str] = []

    def one_request() -> None:
        r = httpx.post(
            f"{srv.v1}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 150,
                  "ignore_eos": True},
            timeout=120,
        )  # fmt: skip
        results.append(r.json()["choices"][0]["finish_reason"])

    worker = threading.Thread(target=one_request)
    worker.start()
    assert wait_for(lambda: metric(srv, "tokenmill:num_requests_running") == 1, 60)
    if group:  # the engine core, the body-parsing worker (and multiprocessing's tracker)
        tasks = Path(f"/proc/{srv.proc.pid}/task").glob("*/children")
        children = {int(pid) for task in tasks for pid in task.read_text().split()}
        assert len(children) >= 2, children
        for pid in children:
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGINT)
    srv.proc.send_signal(signal.SIGTERM)
    # while it drains: still listening, /health says 503, new work is refused with 503
    assert wait_for(lambda: httpx.get(f"{srv.base_url}/health").status_code == 503, 10)
    assert httpx.get(f"{srv.base_url}/health").json()["error"]["code"] == "draining"
    late = httpx.post(
        f"{srv.v1}/chat/completions", json={**stream_body(5), "stream": False}, timeout=10
    )
    assert late.status_code == 503 and late.json()["error"]["code"] == "server_shutting_down"
    assert worker.is_alive(), "the in-flight request should still be running"
    worker.join(120)
    assert results == ["length"], "the in-flight request must finish during the drain"
    assert srv.proc.wait(60) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{srv.base_url}/health", timeout=2)
    assert " ERROR " not in srv.log() and "Traceback" not in srv.log(), srv.log()[-3000:]


def test_engine_crash_fails_requests_and_health(tmp_path):
    srv = start_server(tmp_path)
    try:
        pid = httpx.get(f"{srv.base_url}/server_info").json()["engine"]["pid"]
        outcome: dict = {}

        def stream() -> None:
            lines = []
            with httpx.stream(
                "POST", f"{srv.v1}/chat/completions", json=stream_body(), timeout=60
            ) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
            outcome["lines"] = lines

        t = threading.Thread(target=stream)
        t.start()
        assert wait_for(lambda: metric(srv, "tokenmill:num_requests_running") == 1, 60)
        os.kill(pid, signal.SIGKILL)
        t.join(30)
        assert not t.is_alive(), "the stream hung after the engine died"
        assert '"error"' in outcome["lines"][-2] and outcome["lines"][-1] == "data: [DONE]"
        assert wait_for(lambda: httpx.get(f"{srv.base_url}/health").status_code == 503, 10)
        r = httpx.post(
            f"{srv.v1}/chat/completions", json={**stream_body(5), "stream": False}, timeout=10
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        # admin calls answer at once (they used to wait forever on a dead engine), and the
        # metrics no longer show requests running
        for method, path in (("GET", "/kv_cache"), ("POST", "/reset_prefix_cache")):
            r = httpx.request(method, f"{srv.base_url}{path}", timeout=10)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        assert metric(srv, "tokenmill:num_requests_running") == 0
    finally:
        srv.stop()


def test_queue_full_503_and_api_key(tmp_path):
    srv = start_server(
        tmp_path, "--api-key", "sekrit", "--max-num-seqs", "1", "--max-queue-len", "1"
    )
    auth = {"Authorization": "Bearer sekrit"}
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        missing = httpx.post(f"{srv.v1}/chat/completions", json=body, timeout=10)
        wrong = httpx.post(
            f"{srv.v1}/chat/completions",
            json=body,
            headers={"Authorization": "Bearer x"},
            timeout=10,
        )
        assert missing.status_code == wrong.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{srv.base_url}/health").status_code == 200  # open without a key
        assert httpx.get(f"{srv.v1}/models", headers=auth).status_code == 200

        long_body = {**body, "max_tokens": 100, "ignore_eos": True}

        def send() -> httpx.Response:
            return httpx.post(
                f"{srv.v1}/chat/completions", json=long_body, headers=auth, timeout=120
            )

        with cf.ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(lambda _: send(), range(6)))
        codes = sorted(r.status_code for r in responses)
        assert codes.count(200) >= 2 and 503 in codes, codes
        busy = next(r for r in responses if r.status_code == 503)
        assert busy.headers["retry-after"] and busy.json()["error"]["code"] == "server_busy"
    finally:
        assert srv.stop() == 0
