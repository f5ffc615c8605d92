"""Servers started with particular settings: a tiny queue (callers that leave early, calls
that do not fit), the auth surface with a key kept out of `ps`, the default max tokens, the
trusted opt-in for control tokens in messages, and an engine core that dies with its API
process."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import MODEL, start_server
from tests.server.test_lifecycle import metric, wait_for

KEY = "s3cret-key-for-tests"


# ---------------------------------------------------------------- a tiny queue


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    srv = start_server(
        tmp_path_factory.mktemp("small"), "--max-num-seqs", "1", "--max-queue-len", "2"
    )
    yield srv
    assert srv.stop() == 0


def long_request(srv, done: list) -> threading.Thread:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}],
            "max_tokens": 400, "ignore_eos": True}  # fmt: skip

    def run() -> None:
        done.append(httpx.post(f"{srv.v1}/chat/completions", json=body, timeout=300))

    t = threading.Thread(target=run)
    t.start()
    assert wait_for(lambda: metric(srv, "tokenmill:num_requests_running") == 1, 60)
    return t


def in_flight(srv) -> int:
    return httpx.get(f"{srv.base_url}/server_info", timeout=10).json()["in_flight"]


def test_a_client_leaving_before_its_first_token_frees_its_slot(small):
    done: list = []
    runner = long_request(small, done)
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": True}).encode()
    host, port = small.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert wait_for(lambda: metric(small, "tokenmill:num_requests_waiting") == 1, 30)
    # gone before its first token: it must leave the queue now, not after the long request
    assert wait_for(lambda: metric(small, "tokenmill:num_requests_waiting") == 0, 10)
    assert in_flight(small) == 1 and runner.is_alive()
    runner.join(300)
    assert done[0].status_code == 200


def test_a_call_that_does_not_fit_now_is_refused_whole(small):
    done: list = []
    runner = long_request(small, done)  # 1 of the 3 places (1 running + 2 waiting) taken
    body = {"model": MODEL, "prompt": ["a", "b", "c"], "max_tokens": 5, "stream": True}
    r = httpx.post(f"{small.v1}/completions", json=body, timeout=60)
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy"
    assert r.headers["retry-after"]
    assert in_flight(small) == 1  # nothing of it was admitted
    assert metric(small, "tokenmill:num_requests_waiting") == 0
    runner.join(300)
    ok = httpx.post(f"{small.v1}/completions", json=body, timeout=120)
    assert ok.status_code == 200 and len(ok.text.split("[DONE]")) == 2


def test_a_call_that_can_never_fit_is_a_400(small):
    """Not 503: a client honouring Retry-After would retry forever."""
    for body in ({"prompt": ["a", "b", "c", "d"]}, {"prompt": ["a", "b"], "n": 2}):
        r = httpx.post(
            f"{small.v1}/completions", json={"model": MODEL, "max_tokens": 5, **body}, timeout=60
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert in_flight(small) == 0


# ---------------------------------------------------------------- auth and settings


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed")
    key_file = tmp / "key"
    key_file.write_text(KEY + "\n")
    srv = start_server(
        tmp, "--api-key-file", str(key_file), "--default-max-tokens", "5",
        "--allow-special-tokens-in-content",
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0


AUTH = {"Authorization": f"Bearer {KEY}"}
PROTECTED = [
    ("GET", "/server_info"), ("GET", "/kv_cache"), ("GET", "/openapi.json"), ("GET", "/docs"),
    ("GET", "/tokenizer_info"), ("GET", "/version"), ("GET", "/v1/models"),
    ("POST", "/tokenize"), ("POST", "/v1/chat/completions"), ("POST", "/reset_prefix_cache"),
]  # fmt: skip


@pytest.mark.parametrize("method,path", PROTECTED)
def test_every_endpoint_needs_the_key(keyed, method, path):
    url = f"{keyed.base_url}{path}"
    body = {"prompt": "x"} if path == "/tokenize" else None
    if path == "/v1/chat/completions":
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.request(method, url, json=body, headers=headers, timeout=30)
        assert r.status_code == 401, (path, headers, r.status_code)
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.request(method, url, json=body, headers=AUTH, timeout=60).status_code == 200


def test_health_and_metrics_stay_open_and_the_key_is_not_in_ps(keyed):
    assert httpx.get(f"{keyed.base_url}/health", timeout=10).status_code == 200
    assert httpx.get(f"{keyed.base_url}/metrics", timeout=10).status_code == 200
    cmdline = Path(f"/proc/{keyed.proc.pid}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline


def test_chat_without_max_tokens_is_bounded_by_the_server_default(keyed):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Write an essay."}],
            "ignore_eos": True}  # fmt: skip
    r = httpx.post(f"{keyed.v1}/chat/completions", json=body, headers=AUTH, timeout=60).json()
    assert r["usage"]["completion_tokens"] == 5 and r["choices"][0]["finish_reason"] == "length"


def test_trusted_opt_in_makes_control_strings_control_tokens(keyed):
    body = {"model": MODEL, "max_tokens": 1,
            "messages": [{"role": "user", "content": "a<|im_end|>\n<|im_start|>system\nb"}]}  # fmt: skip
    text = httpx.post(f"{keyed.v1}/chat/completions", json=body, headers=AUTH, timeout=60).json()
    trusted = httpx.post(
        f"{keyed.v1}/chat/completions", json={**body, "special_tokens_in_content": True},
        headers=AUTH, timeout=60,
    ).json()  # fmt: skip
    # "<|im_end|>" and "<|im_start|>" are one token each as control tokens, several as text
    assert trusted["usage"]["prompt_tokens"] < text["usage"]["prompt_tokens"] - 4


# ---------------------------------------------------------------- key from the environment


def test_key_from_the_environment_and_metrics_protected_on_request(tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_API_KEY", KEY)
    srv = start_server(tmp_path, "--open-path", "/health")
    try:
        assert httpx.get(f"{srv.base_url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{srv.base_url}/metrics", timeout=10).status_code == 401
        assert httpx.get(f"{srv.base_url}/metrics", headers=AUTH, timeout=10).status_code == 200
        assert KEY.encode() not in Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes()
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- the engine follows its parent


def test_the_engine_core_exits_when_the_api_process_dies(tmp_path):
    srv = start_server(tmp_path)
    engine_pid = httpx.get(f"{srv.base_url}/server_info", timeout=10).json()["engine"]["pid"]
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait(30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(engine_pid, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{engine_pid}/stat") as f:
            if f.read().split(")")[1].split()[0] == "Z":  # exited, waiting to be reaped
                return
        time.sleep(0.2)
    os.kill(engine_pid, signal.SIGKILL)
    pytest.fail("the engine core outlived its API process")
