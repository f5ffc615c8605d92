"""Two real replicas (KV events on) and a real `tokenmill router` process in front."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tokenmill.router.cluster import ReplicaProcess, free_port, start_cluster, stop_cluster

MODEL = "SmolLM2-135M-Instruct"


@dataclass
class Cluster:
    replicas: list[ReplicaProcess]
    router: subprocess.Popen
    url: str
    log_path: Path

    def info(self) -> dict:
        return httpx.get(self.url + "/router_info", timeout=10).json()

    def replica_info(self, name: str) -> dict:
        return next(r for r in self.info()["replicas"] if r["name"] == name)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_router(
    replicas: list[ReplicaProcess], log_dir: Path, *extra: str
) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    replica_args = [
        a for r in replicas for a in ("--replica", f"{r.spec.url},{r.spec.events},{r.spec.replay}")
    ]
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "--log-level", "INFO", "router",
        "--port", str(port), "--health-interval", "0.5", "--log-decisions", *replica_args, *extra,
    ]  # fmt: skip
    log_path = log_dir / f"router-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"router exited:\n{log_path.read_text()}")
        try:
            info = httpx.get(url + "/router_info", timeout=2).json()
            if all(r["healthy"] and r["events"] == "synced" for r in info["replicas"]):
                return proc, url, log_path
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"router not ready:\n{log_path.read_text()}")


@pytest.fixture
def anyio_backend() -> str:
    """The backend of the async tests (`pytest.mark.anyio`)."""
    return "asyncio"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    log_dir = tmp_path_factory.mktemp("cluster")
    replicas = start_cluster(
        2, ["--kv-cache-memory", "0.25", "--max-num-seqs", "64"], log_dir, threads=1,
        log_level="INFO",
    )  # fmt: skip
    try:
        router, url, log_path = start_router(replicas, log_dir)
    except BaseException:
        stop_cluster(replicas)
        raise
    yield Cluster(replicas, router, url, log_path)
    router.terminate()
    try:
        router.wait(30)
    except subprocess.TimeoutExpired:
        router.kill()
    stop_cluster(replicas)
