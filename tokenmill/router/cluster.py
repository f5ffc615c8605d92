"""`tokenmill cluster`: N engine replicas on this machine (threads split between them), each
publishing KV events, for the router to sit in front of."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from tokenmill.ports import PortPool, free_port  # noqa: F401  (imported from here too)
from tokenmill.router.auth import API_KEY_ENV
from tokenmill.router.replicas import ReplicaSpec

logger = logging.getLogger("tokenmill.router")


@dataclass
class ReplicaProcess:
    proc: subprocess.Popen
    spec: ReplicaSpec
    log_path: Path
    terminating: bool = False

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def terminate(self) -> None:
        """One SIGTERM: a second one can land while the replica's interpreter is already
        exiting, where the default action kills it (exit -15) instead of a clean 0."""
        if self.proc.poll() is None and not self.terminating:
            self.proc.send_signal(signal.SIGTERM)
            self.terminating = True

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                return self.proc.wait()
        return self.proc.returncode


def threads_per_replica(n: int, cores: int | None = None) -> int:
    return max(1, (cores or os.cpu_count() or 1) // n)


def start_replica(
    engine_argv: list[str],
    log_dir: Path,
    threads: int | None,
    host: str = "127.0.0.1",
    log_level: str = "WARNING",
    api_key: str | None = None,
    prefix: Sequence[str] = (),
    ports: PortPool | None = None,
) -> ReplicaProcess:
    """With `api_key`, the replica requires it; it goes through the environment (argv is
    visible to every user in `ps`). `prefix` comes before the command (a wrapper that
    execs it). Its HTTP, event and replay ports come from `ports` (default: any free)."""
    ports = ports if ports is not None else PortPool()
    port, events, replay = ports.take(host), ports.take(host), ports.take(host)
    spec = ReplicaSpec(f"http://{host}:{port}", f"tcp://{host}:{events}", f"tcp://{host}:{replay}")
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "--log-level", log_level, "serve",
        "--host", host, "--port", str(port),
        "--kv-events-endpoint", spec.events, "--kv-events-replay-endpoint", spec.replay,
        *(["--num-threads", str(threads)] if threads else []), *engine_argv,
    ]  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"replica-{port}.log"
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if api_key is not None:
        env[API_KEY_ENV] = api_key
    with open(log_path, "w") as log:  # the process has its own copy
        proc = subprocess.Popen(
            [*prefix, *cmd], stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    return ReplicaProcess(proc, spec, log_path)


def wait_ready(replicas: list[ReplicaProcess], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(replicas)
    while pending:
        for r in list(pending):
            if r.proc.poll() is not None:
                raise RuntimeError(
                    f"replica {r.spec.url} exited with {r.proc.returncode}:\n{r.log_tail()}"
                )
            try:
                if httpx.get(r.spec.url + "/health", timeout=2).status_code == 200:
                    pending.remove(r)
                    logger.warning("replica %s ready (log %s)", r.spec.url, r.log_path)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"replicas not ready in {timeout_s:g}s: {pending[0].log_tail()}")
        if pending:
            time.sleep(0.1)


def start_cluster(
    n: int,
    engine_argv: list[str],
    log_dir: Path,
    threads: int | None = None,
    log_level: str = "WARNING",
    api_key: str | None = None,
    roles: list[str] | None = None,
    ports: PortPool | None = None,
) -> list[ReplicaProcess]:
    """Starts n replicas (each with its --role, if given) and waits until all are healthy
    (stops them all on failure)."""
    threads = threads or threads_per_replica(n)
    replicas: list[ReplicaProcess] = []
    try:
        for i in range(n):
            argv = engine_argv
            if roles is not None and roles[i] != "both":
                argv = [*engine_argv, "--role", roles[i]]
            replicas.append(
                start_replica(
                    argv, log_dir, threads, log_level=log_level, api_key=api_key, ports=ports
                )
            )
        wait_ready(replicas)
    except BaseException:
        stop_cluster(replicas)
        raise
    return replicas


def stop_cluster(replicas: list[ReplicaProcess]) -> list[int]:
    for r in replicas:  # all drain at once
        r.terminate()
    return [r.stop() for r in replicas]
