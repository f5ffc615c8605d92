"""Start-up: the API process serves without torch, and the start-up profile accounts for the
measured time from launch to ready."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.conftest import MODEL, ServerProcess, free_port

API_PHASES = [
    "interpreter",
    "arguments",
    "start the engine core",
    "imports",
    "tokenizer and chat template",
    "build the app",
    "wait for the engine core",
]
CORE_PHASES = [
    "spawn",
    "imports",
    "read weights",
    "native kernels",
    "build model",
    "choose row kernels",
    "allocate KV cache",
    "scheduler",
    "warm-up",
]


def mapped_libraries(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def thread_nice_values(pid: int) -> set[int]:
    values = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            values.add(int(f.read().rsplit(")", 1)[1].split()[16]))
    return values


def exercise_the_api(base: str) -> None:
    """Requests that reach the API's lazily imported paths: chat, structured output, tools,
    completions with logprobs, tokenization."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {}}},
    }
    bodies = [
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "stream": True}),
        (
            "/v1/chat/completions",
            {
                **chat,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": schema},
                },
                "max_tokens": 12,
            },
        ),  # fmt: skip
        ("/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": "required"}),
        ("/v1/completions", {"model": MODEL, "prompt": "A", "max_tokens": 3, "logprobs": 2}),
        ("/tokenize", {"model": MODEL, "prompt": "Hello"}),
    ]
    for path, body in bodies:
        r = httpx.post(base + path, json=body, timeout=60)
        assert r.status_code == 200, (path, r.text)
    assert httpx.get(base + "/metrics", timeout=10).status_code == 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_api_process_has_no_torch_and_the_start_up_profile_adds_up(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "serve", "--log-level", "debug",
        "--port", str(port), "--kv-cache-memory", "0.5",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        launched = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(proc, base, str(log_path))
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, server.log()
            assert time.monotonic() < deadline, server.log()
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        measured = time.time() - launched

        startup = httpx.get(base + "/server_info", timeout=10).json()["startup"]
        api, core = startup["api"], startup["engine_core"]
        assert [p["name"] for p in api["phases"]] == API_PHASES
        assert [p["name"] for p in core["phases"]] == CORE_PHASES
        for profile in (api, core):
            assert sum(p["seconds"] for p in profile["phases"]) == pytest.approx(
                profile["total_s"], abs=0.005 * len(profile["phases"])
            )
        # the profile starts when the process was created and ends when it serves
        assert abs(api["launched_at"] - launched) < 0.25
        assert abs(api["total_s"] - measured) <= 0.1 * measured, (api, measured)
        # the engine core is started by the API process and is ready before it serves
        assert api["launched_at"] <= core["launched_at"]
        assert core["launched_at"] + core["total_s"] <= api["launched_at"] + api["total_s"]

        exercise_the_api(base)
        engine_pid = httpx.get(base + "/server_info", timeout=10).json()["engine"]["pid"]
        assert "libtorch" in mapped_libraries(engine_pid)  # the check can see torch
        assert "libtorch" not in mapped_libraries(proc.pid)
        assert "torch" not in mapped_libraries(proc.pid)
        # start-up work ran at a lower priority; no thread kept it (threads inherit it)
        assert thread_nice_values(proc.pid) == {0} and thread_nice_values(engine_pid) == {0}
    finally:
        assert server.stop() == 0
    log_text = server.log()
    assert "api start-up: wait for the engine core" in log_text
    assert "engine-core start-up: build model" in log_text


def processes_with(marker: str) -> list[int]:
    """Pids whose environment holds `marker` (the launched process and its children)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def wait_until_gone(marker: str, timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_engine_core_forked_before_parsing_goes_away_when_serve_does_not_start(tmp_path):
    """`serve` forks its engine core before it parses its arguments (so the core imports
    torch meanwhile): bad arguments, a bad option value or --help end it with the parent."""
    for i, argv in enumerate(
        (["--no-such-option"], ["--max-num-seqs", "0"], ["--help"], ["--model", str(tmp_path)])
    ):
        marker = f"TOKENMILL_TEST_MARK=early-{os.getpid()}-{i}"
        env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "tokenmill.cli", "serve", *argv],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert done.returncode == (0 if argv == ["--help"] else 2), (argv, done.stderr[-2000:])
        assert time.monotonic() - started < 30, argv
        assert wait_until_gone(marker) == [], argv


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_engine_core_goes_away_with_a_killed_server():
    for delay in (0.0, 0.6):  # likely before, and surely after, the core has its arguments
        marker = f"TOKENMILL_TEST_MARK=killed-{os.getpid()}-{delay}"
        env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
        cmd = [sys.executable, "-m", "tokenmill.cli", "serve", "--port", str(free_port())]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while len(processes_with(marker)) < 2:  # the server and its engine core
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.005)
        time.sleep(delay)
        proc.kill()
        proc.wait()
        assert wait_until_gone(marker) == [], delay
