"""A throwaway PostgreSQL server for tests: initdb in a temp dir, postgres on a free port.

Binaries come from, in order: the `pgserver` wheel (PyPI; ships PostgreSQL in the wheel, so a
clean machine gets it from `pip install -e .[test]`), `pg_config --bindir` on PATH, and
Debian's /usr/lib/postgresql/*/bin. PostgreSQL refuses to run as root, so as root the server
runs as `nobody` (the data directory is chowned to it). `start_server()` tries each candidate
and raises ServerUnavailable naming everything it tried.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

STARTUP_TIMEOUT_S = 30


class ServerUnavailable(RuntimeError):
    pass


def candidate_bindirs() -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.origin is not None:
        found.append(("pgserver wheel", Path(spec.origin).parent / "pginstall" / "bin"))
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0:
            found.append(("pg_config --bindir", Path(out.stdout.strip())))
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        found.append(("Debian postgresql", d))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One server process over one data directory; stop() and start() again keep the data."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.base = Path(tempfile.mkdtemp(prefix="tokenmill-pg-"))
        self.data = self.base / "data"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._ids: dict[str, int] = {}
        if os.geteuid() == 0:  # postgres will not run as root
            user = pwd.getpwnam("nobody")
            self._ids = {"user": user.pw_uid, "group": user.pw_gid}
            os.chown(self.base, user.pw_uid, user.pw_gid)
        self.base.chmod(0o755)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
            "--encoding=UTF8", "--no-sync",
        )  # fmt: skip

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run(
            [str(self.bindir / tool), *args],
            cwd=self.base, capture_output=True, text=True, timeout=60, **self._kwargs(),
        )  # fmt: skip
        if out.returncode != 0:
            raise ServerUnavailable(f"{tool} failed: {(out.stderr or out.stdout).strip()[-400:]}")

    def _kwargs(self) -> dict:
        return {**self._ids, "extra_groups": []} if self._ids else {}

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        log = open(self.base / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.proc = subprocess.Popen(
            [
                str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
                "-h", "127.0.0.1", "-k", str(self.base),
                "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off",
            ],
            cwd=self.base, stdout=log, stderr=subprocess.STDOUT, **self._kwargs(),
        )  # fmt: skip
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise ServerUnavailable(f"postgres exited: {self.log_tail()}")
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise ServerUnavailable(f"postgres not ready: {self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        try:
            return (self.base / "server.log").read_text()[-600:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Fast shutdown (clients are disconnected), waiting for the process to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def start_server() -> PostgresServer:
    """A running server from the first candidate that works; ServerUnavailable otherwise."""
    tried = []
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise ServerUnavailable("psycopg is not installed (pip install -e .[test])") from None
    for label, bindir in candidate_bindirs():
        if not (bindir / "postgres").exists():
            tried.append(f"{label} ({bindir}): no postgres binary")
            continue
        server = None
        try:
            server = PostgresServer(bindir)
            server.start()
            return server
        except (ServerUnavailable, OSError, subprocess.SubprocessError) as e:
            tried.append(f"{label} ({bindir}): {e}")
            if server is not None:
                server.destroy()
    if not tried:
        tried.append("no candidates: pgserver wheel not installed, no pg_config on PATH, "
                     "no /usr/lib/postgresql/*/bin")  # fmt: skip
    raise ServerUnavailable("no PostgreSQL server could start; tried: " + "; ".join(tried))
