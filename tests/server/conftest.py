"""Real `tokenmill serve` processes on free localhost ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

MODEL = "SmolLM2-135M-Instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    base_url: str
    log_path: str

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        return self.proc.returncode


def start_server(tmp_path, *extra: str, ready_timeout: float = 180) -> ServerProcess:
    port = free_port()
    log_path = str(tmp_path / f"server-{port}.log")
    if "--response-store" not in extra:  # never the user's own database
        extra = ("--response-store", str(tmp_path / f"responses-{port}.sqlite3"), *extra)
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "--log-level", "INFO", "serve",
        "--port", str(port), "--kv-cache-memory", "0.5", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(log_path, "w")  # noqa: SIM115  (owned by the process)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log()}")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"server not ready in {ready_timeout}s:\n{server.log()}")


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("server"), "--max-num-seqs", "32")
    yield srv
    code = srv.stop()
    assert code == 0, f"server exit code {code} after SIGTERM:\n{srv.log()[-3000:]}"


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
