"""`tokenmill cluster` end to end: replicas + router start, serve, and stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.router.conftest import MODEL
from tokenmill.router.auth import API_KEY_ENV
from tokenmill.router.cluster import free_port


def test_cluster_command_serves_and_shuts_down(tmp_path):
    """With a key from the environment: the router wants it, and gets through to replicas."""
    port = free_port()
    key = "sk-cluster-test"
    auth = {"Authorization": f"Bearer {key}"}
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "cluster", "--replicas", "2", "--port", str(port),
        "--kv-cache-memory", "0.1", "--log-dir", str(tmp_path), "--max-num-seqs", "8",
    ]  # fmt: skip
    log = open(tmp_path / "cluster.out", "w")  # noqa: SIM115
    env = {**os.environ, "PYTHONUNBUFFERED": "1", API_KEY_ENV: key}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        info = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "cluster.out").read_text()
            try:
                info = httpx.get(url + "/router_info", headers=auth, timeout=2).json()
                if all(r["healthy"] and r["events"] == "synced" for r in info["replicas"]):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert info is not None and len(info["replicas"]) == 2
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/v1/models", headers=auth).json()["data"][0]["id"] == MODEL
        r = httpx.post(url + "/v1/completions", timeout=60, headers=auth,
                       json={"model": MODEL, "prompt": "Hello", "max_tokens": 2})  # fmt: skip
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        logs = sorted(p.name for p in tmp_path.glob("replica-*.log"))
        assert len(logs) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        out = (tmp_path / "cluster.out").read_text()
        assert "replicas stopped (exit codes [0, 0])" in out, out
    finally:
        if proc.poll() is None:  # stops its replicas on SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
