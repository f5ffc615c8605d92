"""The server's SQLite file: everything it keeps across restarts (stored responses; the Batch
API's files and batches can share it). One connection in WAL mode, serialised by a lock and
used off the event loop; several server processes may open the same file."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tokenmill.cache_dirs import cache_root

T = TypeVar("T")
MEMORY = ":memory:"


def default_database_path() -> Path:
    return cache_root() / "server.sqlite3"


def check_database(path: str | Path, flag: str) -> None:
    """Opens the file now: a clear start-up error (naming the flag) instead of a failing
    first request."""
    try:
        Database(path).close()
    except (OSError, sqlite3.Error) as e:
        raise ValueError(f"{flag}: cannot open {path}: {e}") from e


class Database:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # autocommit: each store method opens its own transaction (BEGIN IMMEDIATE)
        self._conn = sqlite3.connect(
            self.path, timeout=10, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()

    def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn(connection) under the lock, on the calling thread."""
        with self._lock:
            return fn(self._conn)

    def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """fn(connection) in one write transaction (rolled back if it raises)."""

        def run(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return self.call(run)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
