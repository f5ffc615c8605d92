"""The Ray actor behind one worker: it runs the same `tokenmill serve` (API + engine-core
process pair) as a local cluster does, bound to its node's address on free ports, and
reports the endpoints. If the server dies, the actor exits with it, so that Ray restarts
the actor (and with it a fresh server); if the actor dies, the server is killed with it.

No `ray` import here: the launcher wraps this class with `ray.remote` (it also runs in
plain tests)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tokenmill.router.cluster import ReplicaProcess, start_replica, wait_ready

logger = logging.getLogger("tokenmill.cluster")


class ServeActor:
    def __init__(
        self,
        argv: list[str],
        threads: int | None,
        log_level: str = "WARNING",
        api_key: str | None = None,
        ready_timeout_s: float = 300.0,
        host: str | None = None,
    ) -> None:
        """Returns once the server answers /health (Ray marks the actor alive then)."""
        t0 = time.monotonic()
        self.host = host or node_address()
        self.node_id = node_id()
        self.incarnation = uuid.uuid4().hex
        self.log_dir = Path(tempfile.gettempdir()) / "tokenmill-workers"
        self.stopping = False
        self._started = threading.Event()
        self._error: BaseException | None = None
        self.process: ReplicaProcess | None = None
        # PR_SET_PDEATHSIG fires when the *thread* that forked the server ends: this one
        # lives exactly as long as the server
        args = (reachable(argv, self.host), threads, log_level, api_key)
        threading.Thread(target=self._own, args=args, name="serve", daemon=True).start()
        self._started.wait()
        if self.process is None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        wait_ready([self.process], ready_timeout_s)
        self.ready_s = time.monotonic() - t0

    def _own(self, argv: list[str], threads: int | None, log_level: str,
             api_key: str | None) -> None:  # fmt: skip
        try:
            self.process = start_replica(
                argv, self.log_dir, threads, self.host, log_level, api_key,
                prefix=(sys.executable, "-m", "tokenmill.cluster.exec_with_parent"),
            )  # fmt: skip
        except BaseException as e:
            self._error = e
            return
        finally:
            self._started.set()
        code = self.process.proc.wait()
        if not self.stopping:
            # a failure, not a stop: the actor goes too, so Ray restarts it
            print(f"tokenmill serve exited with {code}:\n{self.process.log_tail()}", flush=True)
            os._exit(1)

    def info(self) -> dict:
        p = self.process
        assert p is not None
        return {
            "url": p.spec.url,
            "events": p.spec.events,
            "replay": p.spec.replay,
            "incarnation": self.incarnation,
            "node": self.host,
            "node_id": self.node_id,
            "pid": os.getpid(),
            "serve_pid": p.proc.pid,
            "log": str(p.log_path),
            "ready_s": round(self.ready_s, 2),
        }

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM: the server drains its requests and exits; then the actor can go."""
        self.stopping = True
        assert self.process is not None
        return self.process.stop(timeout_s)

    def log_tail(self, n: int = 3000) -> str:
        return self.process.log_tail(n) if self.process else ""


def reachable(argv: list[str], host: str) -> list[str]:
    """A prefill worker's KV block server on the node's address (the default binds
    127.0.0.1: decode workers on other nodes could not load from it), unless set."""
    if "prefill" not in argv or "--kv-transfer-endpoint" in argv:
        return argv
    i = argv.index("--role") if "--role" in argv else -1
    if i < 0 or argv[i + 1 : i + 2] != ["prefill"]:
        return argv
    return [*argv, "--kv-transfer-endpoint", f"tcp://{host}:0"]


def node_id() -> str | None:
    """Ray's id of this node (several nodes can share an address: one machine, tests)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def node_address() -> str:
    """This node's address as Ray knows it (what other nodes reach it by)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return socket.gethostbyname(socket.gethostname())
