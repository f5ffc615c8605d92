"""Ports for the servers a command starts itself (`cluster` replicas, `tune` trials, `bench
--compare` peers): free ones the OS picks, or with `--port-range LO-HI` free ones inside
that range (e.g. the ports a firewall opens)."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

MAX_PORT = 65535
HOLD_S = 600.0  # a port handed out is not handed out again this long (the server binds it later)


@dataclass(frozen=True)
class PortRange:
    low: int
    high: int

    def __str__(self) -> str:
        return f"{self.low}-{self.high}"


def parse_port(text: str) -> int:
    """A TCP port, 0-65535 (argparse's `type`: checked before a model loads)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= port <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"a port is 0-{MAX_PORT}, got {port}")
    return port


def parse_port_range(text: str) -> PortRange:
    """`LO-HI` (argparse's `type`: an error exits 2 naming the flag)."""
    low, sep, high = text.partition("-")
    try:
        if not sep:
            raise ValueError
        port_range = PortRange(int(low), int(high))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LO-HI, two port numbers: {text!r}") from None
    if not 1 <= port_range.low <= port_range.high <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI <= {MAX_PORT}: {text!r}")
    return port_range


def add_port_range_option(p: argparse.ArgumentParser | argparse._ArgumentGroup, what: str) -> None:
    p.add_argument(
        "--port-range", type=parse_port_range, default=None, metavar="LO-HI",
        help=f"ports of the {what} started here: free ones in LO..HI (default: any free port)",
    )  # fmt: skip


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS finds free now (nothing holds it for the caller)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class NoFreePort(ValueError):
    pass


class PortPool:
    """Hands out ports for servers about to start: each free when handed out, and not
    handed out again for `hold_s` (until its server binds it, it still looks free)."""

    def __init__(
        self,
        port_range: PortRange | None = None,
        exclude: Iterable[int] = (),
        hold_s: float = HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.port_range = port_range
        self.exclude = frozenset(exclude)  # e.g. the router's own --port, bound later
        self.hold_s = hold_s
        self.clock = clock
        self._given: dict[int, float] = {}
        self._lock = threading.Lock()

    def take(self, host: str = "127.0.0.1") -> int:
        with self._lock:
            now = self.clock()
            port = self._find(host, now)
            self._given[port] = now
            return port

    def _held(self, port: int, now: float) -> bool:
        given = self._given.get(port)
        return port in self.exclude or (given is not None and now - given < self.hold_s)

    def _find(self, host: str, now: float) -> int:
        if self.port_range is None:
            for _ in range(100):
                port = free_port(host)
                if not self._held(port, now):
                    return port
            raise NoFreePort("no free port")
        r = self.port_range
        for port in range(r.low, r.high + 1):
            if not self._held(port, now) and is_free(host, port):
                return port
        raise NoFreePort(
            f"--port-range {r}: no free port left on {host} ({r.high - r.low + 1} in the range, "
            "each in use or given to a server this command started)"
        )
