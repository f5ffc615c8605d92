"""SQLite and PostgreSQL behind one small interface, one connection per thread.

SQL is written once with `?` placeholders; the PostgreSQL backend rewrites them to psycopg's
`%s`. The few dialect differences (column types in DDL, UTC day of an epoch) are methods here.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import Any

from tokenmill.gateway.store.errors import StoreError
from tokenmill.gateway.store.url import parse_url, redact_url

Params = Sequence[Any]

# SQLite waits this long for another writer's lock before giving up
SQLITE_BUSY_TIMEOUT_MS = 10_000
POSTGRES_CONNECT_TIMEOUT_S = 5


class Transaction:
    """What `Database.transaction()` yields: statements run inside one transaction."""

    def __init__(self, cursor: Any, prepare: Any) -> None:
        self._cur = cursor
        self._prepare = prepare

    def execute(self, sql: str, params: Params = ()) -> list[tuple]:
        self._cur.execute(self._prepare(sql), params)
        return self._cur.fetchall() if self._cur.description else []

    def executemany(self, sql: str, rows: Iterable[Params]) -> None:
        self._cur.executemany(self._prepare(sql), rows)


class Database(ABC):
    """A database reached through one lazily opened connection per calling thread."""

    dialect: str

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[Any] = []  # every connection opened, for close()
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({redact_url(self.url)!r})"

    # --- connections ---------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> Any: ...

    @abstractmethod
    def _usable(self, conn: Any) -> bool: ...

    def connection(self) -> Any:
        """This thread's connection, (re)opened when missing or broken."""
        if self._closed:
            raise StoreError(f"{self!r} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None or not self._usable(conn):
            if conn is not None:
                self._discard(conn)
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def reset_connection(self) -> None:
        """Drop this thread's connection (after an error); the next use reconnects."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            self._discard(conn)

    def _discard(self, conn: Any) -> None:
        with self._lock:
            if conn in self._all:
                self._all.remove(conn)
        with suppress(Exception):  # already broken: nothing to release
            conn.close()

    def close(self) -> None:
        """Close every thread's connection; the Database is unusable afterwards."""
        self._closed = True
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            with suppress(Exception):
                conn.close()

    # --- statements ----------------------------------------------------------------

    def prepare(self, sql: str) -> str:
        """`sql` in this backend's placeholder style."""
        return sql

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Transaction]:
        """One write transaction: committed on normal exit, rolled back on an exception."""

    def fetchall(self, sql: str, params: Params = ()) -> list[tuple]:
        cur = self.connection().cursor()
        try:
            cur.execute(self.prepare(sql), params)
            return cur.fetchall()
        finally:
            cur.close()

    def fetchone(self, sql: str, params: Params = ()) -> tuple | None:
        rows = self.fetchall(sql, params)
        return rows[0] if rows else None

    # --- dialect -------------------------------------------------------------------

    @abstractmethod
    def ddl(self, sql: str) -> str:
        """Fill a DDL template's `{real}` and `{autoinc_pk}` for this backend."""

    @abstractmethod
    def utc_day(self, column: str) -> str:
        """An expression giving the UTC date 'YYYY-MM-DD' of epoch-seconds `column`."""


def _set_wal(conn: sqlite3.Connection) -> None:
    """WAL journal (persistent in the file). Switching to it takes an exclusive lock, and
    SQLite answers "database is locked" at once, without the busy handler, when connections
    opening a new database at the same moment race for it: retried within the busy timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


class SqliteDatabase(Database):
    dialect = "sqlite"

    def __init__(self, url: str, path: Path) -> None:
        super().__init__(url)
        self.path = path

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit, transactions only where `transaction()` opens one;
        # check_same_thread=False only so close() may close other threads' connections
        conn = sqlite3.connect(
            self.path,
            timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _set_wal(conn)
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    def _usable(self, conn: Any) -> bool:
        return True

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        conn = self.connection()
        # IMMEDIATE takes the write lock up front (waiting busy_timeout for it), so a
        # read-then-write transaction never fails on a lock upgrade
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.cursor()
        try:
            yield Transaction(cur, self.prepare)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")
        finally:
            cur.close()

    def ddl(self, sql: str) -> str:
        return sql.format(real="REAL", autoinc_pk="INTEGER PRIMARY KEY AUTOINCREMENT")

    def utc_day(self, column: str) -> str:
        return f"strftime('%Y-%m-%d', {column}, 'unixepoch')"


class PostgresDatabase(Database):
    dialect = "postgres"

    def __init__(self, url: str) -> None:
        super().__init__(url)
        try:
            import psycopg  # noqa: F401
        except ImportError as e:  # the optional extra
            raise StoreError(
                "a postgresql:// database needs psycopg: pip install 'tokenmill[postgres]'"
            ) from e

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(
            self.url, autocommit=True, connect_timeout=POSTGRES_CONNECT_TIMEOUT_S
        )

    def _usable(self, conn: Any) -> bool:
        return not (conn.closed or conn.broken)

    def prepare(self, sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _stale(self, e: Exception) -> bool:
        """Whether `e` came from this thread's connection having died (say, the server
        restarted since its last use): then nothing ran, and a reconnect is worth a try."""
        import psycopg

        conn = getattr(self._local, "conn", None)
        return isinstance(e, psycopg.OperationalError) and conn is not None and conn.broken

    def fetchall(self, sql: str, params: Params = ()) -> list[tuple]:
        try:
            return super().fetchall(sql, params)
        except Exception as e:  # a read is safe to repeat on a fresh connection
            if not self._stale(e):
                raise
            self.reset_connection()
            return super().fetchall(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        conn = self.connection()
        tx = conn.transaction()
        try:
            tx.__enter__()  # BEGIN: when it fails nothing ran, so reconnecting is safe
        except Exception as e:
            if not self._stale(e):
                raise
            self.reset_connection()
            conn = self.connection()
            tx = conn.transaction()
            tx.__enter__()
        with conn.cursor() as cur:
            try:
                yield Transaction(cur, self.prepare)
            except BaseException as e:
                tx.__exit__(type(e), e, e.__traceback__)
                raise
        tx.__exit__(None, None, None)

    def ddl(self, sql: str) -> str:
        # REAL is single precision in PostgreSQL: costs and timestamps need double
        return sql.format(real="DOUBLE PRECISION", autoinc_pk="BIGSERIAL PRIMARY KEY")

    def utc_day(self, column: str) -> str:
        return f"to_char(to_timestamp({column}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"


def open_database(url: str) -> Database:
    """A Database for `url`: `sqlite:///abs/path`, a plain file path, or `postgresql://...`.

    Nothing connects until first use, so this never fails on an unreachable server."""
    parsed = parse_url(url)
    if parsed.dialect == "sqlite":
        assert parsed.path is not None
        return SqliteDatabase(url, parsed.path)
    return PostgresDatabase(url)
