"""Batches and their line results, in the server's SQLite file. A line's result is committed
the moment it is known (INSERT OR IGNORE: at most one per line), so a restarted server runs
only the lines without one. Blocking methods: callers run them off the event loop."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any

from tokenmill.server.database import Database

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    status TEXT NOT NULL,
    object TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_results (
    batch_id TEXT NOT NULL,
    line INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    result TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
"""
BATCH_ID = r"^batch_[0-9a-f]{24}$"
TERMINAL = ("completed", "failed", "expired", "cancelled")
ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
_PAGE = 1000


class BatchStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        db.call(lambda conn: conn.executescript(_SCHEMA))

    # ------------------------------------------------------------ batch objects

    def create(self, owner: str, batch: dict[str, Any], max_active: int) -> bool:
        """Keeps a new batch; False (nothing kept) when max_active batches are running."""

        def write(conn: sqlite3.Connection) -> bool:
            marks = ",".join("?" * len(ACTIVE))
            active = conn.execute(
                f"SELECT COUNT(*) FROM batches WHERE status IN ({marks})", ACTIVE
            ).fetchone()[0]
            if active >= max_active:
                return False
            conn.execute(
                "INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                (batch["id"], owner, batch["created_at"], batch["status"], json.dumps(batch)),
            )
            return True

        return self.db.transaction(write)

    def get(self, batch_id: str, owner: str | None = None) -> dict[str, Any] | None:
        """The batch object with its request counts; None when missing or (with `owner`)
        someone else's."""

        def read(conn: sqlite3.Connection) -> dict[str, Any] | None:
            sql, args = "SELECT object FROM batches WHERE id = ?", [batch_id]
            if owner is not None:
                sql, args = sql + " AND owner = ?", [batch_id, owner]
            row = conn.execute(sql, args).fetchone()
            return None if row is None else self._with_counts(conn, json.loads(row[0]))

        return self.db.call(read)

    def list(self, owner: str, limit: int, after: str | None) -> tuple[list[dict], bool]:
        """A page of the owner's batches, newest first, and whether more follow."""

        def read(conn: sqlite3.Connection) -> tuple[list[dict], bool]:
            sql, args = "SELECT object FROM batches WHERE owner = ?", [owner]
            if after is not None:
                sql += " AND rowid < COALESCE((SELECT rowid FROM batches WHERE id = ?), -1)"
                args.append(after)
            rows = conn.execute(sql + " ORDER BY rowid DESC LIMIT ?", [*args, limit + 1])
            rows = rows.fetchall()
            page = [self._with_counts(conn, json.loads(r[0])) for r in rows[:limit]]
            return page, len(rows) > limit

        return self.db.call(read)

    def owner(self, batch_id: str) -> str:
        row = self.db.call(
            lambda conn: conn.execute(
                "SELECT owner FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
        )
        return row[0]

    def update(
        self, batch_id: str, changes: dict[str, Any], only_from: tuple[str, ...] = ()
    ) -> dict[str, Any] | None:
        """Merges `changes` into the batch (only while its status is in `only_from`, when
        given); the updated object, or None when nothing changed."""

        def write(conn: sqlite3.Connection) -> dict[str, Any] | None:
            row = conn.execute("SELECT object FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return None
            batch = json.loads(row[0])
            if only_from and batch["status"] not in only_from:
                return None
            batch.update(changes)
            conn.execute(
                "UPDATE batches SET status = ?, object = ? WHERE id = ?",
                (batch["status"], json.dumps(batch), batch_id),
            )
            return batch

        return self.db.transaction(write)

    def active(self) -> list[dict[str, Any]]:
        """Batches not finished yet (what a restarted server resumes), oldest first."""
        marks = ",".join("?" * len(ACTIVE))
        rows = self.db.call(
            lambda conn: conn.execute(
                f"SELECT object FROM batches WHERE status IN ({marks}) ORDER BY rowid", ACTIVE
            ).fetchall()
        )
        return [json.loads(r[0]) for r in rows]

    def uses_file(self, file_id: str) -> str | None:
        """The id of an unfinished batch reading this file, if any."""
        for batch in self.active():
            if batch["input_file_id"] == file_id:
                return batch["id"]
        return None

    # ------------------------------------------------------------ line results

    def record(self, batch_id: str, line: int, ok: bool, result: str) -> None:
        self.db.transaction(
            lambda conn: conn.execute(
                "INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?)",
                (batch_id, line, int(ok), result),
            )
        )

    def done_lines(self, batch_id: str) -> set[int]:
        rows = self.db.call(
            lambda conn: conn.execute(
                "SELECT line FROM batch_results WHERE batch_id = ?", (batch_id,)
            ).fetchall()
        )
        return {r[0] for r in rows}

    def results(self, batch_id: str, ok: bool) -> Iterator[str]:
        """The recorded output (ok) or error lines, in input order, a page at a time."""
        last = -1
        while True:
            rows = self.db.call(
                lambda conn, last=last: conn.execute(
                    "SELECT line, result FROM batch_results WHERE batch_id = ? AND ok = ? "
                    "AND line > ? ORDER BY line LIMIT ?",
                    (batch_id, int(ok), last, _PAGE),
                ).fetchall()
            )
            yield from (r[1] for r in rows)
            if len(rows) < _PAGE:
                return
            last = rows[-1][0]

    def forget_results(self, batch_id: str) -> None:
        """Once the output files are written, the per-line rows are not needed."""
        self.db.transaction(
            lambda conn: conn.execute("DELETE FROM batch_results WHERE batch_id = ?", (batch_id,))
        )

    def _with_counts(self, conn: sqlite3.Connection, batch: dict[str, Any]) -> dict[str, Any]:
        """Request counts from the recorded lines while the batch runs (frozen once done)."""
        if batch["status"] in TERMINAL:
            return batch
        done, ok = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(ok), 0) FROM batch_results WHERE batch_id = ?",
            (batch["id"],),
        ).fetchone()
        counts = batch["request_counts"]
        batch["request_counts"] = {"total": counts["total"], "completed": ok, "failed": done - ok}
        return batch
