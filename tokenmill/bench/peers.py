"""Servers the benchmark starts itself: tokenmill serve and llama.cpp's llama-server."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokenmill import envs
from tokenmill.cache_dirs import cache_root
from tokenmill.ports import PortPool, free_port

LLAMA_CPP_VERSION = "0.3.36"


def find_llama_server() -> Path | None:
    """$TOKENMILL_LLAMA_CPP_BIN (a bin directory, or the binary itself), else the cache
    directory `benchmarks/peers/build_llama_cpp.sh` installs into."""
    env = envs.LLAMA_CPP_BIN.get()
    candidates = []
    if env:
        p = Path(env).expanduser()
        candidates.append(p / "llama-server" if p.is_dir() else p)
    cache = cache_root()
    candidates.append(cache / f"llama.cpp-{LLAMA_CPP_VERSION}" / "bin" / "llama-server")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


@dataclass(frozen=True)
class ServerSpec:
    """How to start one peer: name, argv (with {port} filled in later), health path."""

    name: str
    argv: tuple[str, ...]
    health_path: str = "/health"
    ready_timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=dict)

    def command(self, port: int) -> list[str]:
        return [a.replace("{port}", str(port)) for a in self.argv]


def tokenmill_spec(name: str, model: str, extra: str = "") -> ServerSpec:
    argv = (
        sys.executable, "-m", "tokenmill.cli", "serve",
        "--host", "127.0.0.1", "--port", "{port}", "--model", model, *shlex.split(extra),
    )  # fmt: skip
    return ServerSpec(name, argv)


def llama_server_spec(
    binary: Path, model: str, slots: int, threads: int = 2, ctx: int = 16384, extra: str = ""
) -> ServerSpec:
    """-kvu: one KV pool shared by all slots, so -c is the total (as the auto default does)
    rather than being split into ctx/slots per slot."""
    argv = (
        str(binary), "-m", model, "--host", "127.0.0.1", "--port", "{port}",
        "-t", str(threads), "-c", str(ctx), "-np", str(slots), "-kvu", *shlex.split(extra),
    )  # fmt: skip
    return ServerSpec("llama-server", argv)


class ManagedServer:
    """A started server process; its log goes to `log_path`. Use as a context manager. Its
    port comes from `ports` (default: any free one)."""

    def __init__(self, spec: ServerSpec, log_dir: Path, ports: PortPool | None = None) -> None:
        self.spec = spec
        self.port = ports.take() if ports is not None else free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{spec.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def command(self) -> list[str]:
        return self.spec.command(self.port)

    def start(self) -> ManagedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115  (owned by the process)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.spec.env}
        self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name} exited early:\n{self.tail()}")
            try:
                r = httpx.get(self.base_url + self.spec.health_path, timeout=2)
                if r.status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"{self.spec.name} not healthy in {self.spec.ready_timeout_s:g}s")

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> ManagedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
