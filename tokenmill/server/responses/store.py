"""Stored responses: what GET / DELETE / previous_response_id / background read, in the
server's SQLite file. Each row keeps the response object, the conversation items it answered
(the next turn's context) and its owner; rows expire (TTL) and are capped (count and bytes),
the oldest going first. Every async method runs its SQL off the event loop."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from tokenmill.server.database import Database
from tokenmill.server.responses.config import ResponseStoreConfig
from tokenmill.server.state import off_loop

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    response TEXT NOT NULL,
    context TEXT NOT NULL,
    size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_created_at ON responses (created_at);
"""
_EVICT_BATCH = 64


@dataclass(frozen=True)
class StoredResponse:
    id: str
    owner: str
    created_at: float
    response: dict[str, Any]
    context: list[dict[str, Any]]  # the items the response answered (input_items)

    @property
    def status(self) -> str:
        return self.response["status"]


class ResponseStore:
    def __init__(self, db: Database, config: ResponseStoreConfig) -> None:
        self.db = db
        self.config = config
        db.call(lambda conn: conn.executescript(_SCHEMA))

    # ------------------------------------------------------------ blocking

    def put(self, owner: str, response: dict[str, Any], context: list[dict[str, Any]]) -> None:
        """Inserts or replaces the response (its id and created_at are the object's)."""
        body = json.dumps(response, ensure_ascii=False)
        items = json.dumps(context, ensure_ascii=False)
        row = (
            response["id"], owner, float(response["created_at"]), response["status"], body,
            items, len(body) + len(items),
        )  # fmt: skip

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            self._evict(conn, time.time())

        self.db.transaction(write)

    def get(self, response_id: str, owner: str) -> StoredResponse | None:
        """None when missing, expired or someone else's (the caller cannot tell which)."""
        cutoff = time.time() - self.config.ttl_s
        row = self.db.call(
            lambda conn: conn.execute(
                "SELECT id, owner, created_at, response, context FROM responses "
                "WHERE id = ? AND owner = ? AND created_at >= ?",
                (response_id, owner, cutoff),
            ).fetchone()
        )
        if row is None:
            return None
        return StoredResponse(row[0], row[1], row[2], json.loads(row[3]), json.loads(row[4]))

    def delete(self, response_id: str, owner: str) -> bool:
        return self.db.transaction(
            lambda conn: (
                conn.execute(
                    "DELETE FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
                ).rowcount
                > 0
            )
        )

    def count(self) -> tuple[int, int]:
        """(rows, bytes) stored."""
        return self.db.call(
            lambda conn: conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses"
            ).fetchone()
        )

    def _evict(self, conn: sqlite3.Connection, now: float) -> None:
        """Expired rows, then the oldest beyond the row and byte caps."""
        conn.execute("DELETE FROM responses WHERE created_at < ?", (now - self.config.ttl_s,))
        rows, size = conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses"
        ).fetchone()
        if rows > self.config.max_rows:
            conn.execute(
                "DELETE FROM responses WHERE id IN "
                "(SELECT id FROM responses ORDER BY created_at LIMIT ?)",
                (rows - self.config.max_rows,),
            )
            size = conn.execute("SELECT COALESCE(SUM(size), 0) FROM responses").fetchone()[0]
        while size > self.config.max_bytes:
            oldest = conn.execute(
                "SELECT id, size FROM responses ORDER BY created_at LIMIT ?", (_EVICT_BATCH,)
            ).fetchall()
            for rid, row_size in oldest:
                conn.execute("DELETE FROM responses WHERE id = ?", (rid,))
                size -= row_size
                if size <= self.config.max_bytes:
                    break

    # ------------------------------------------------------------ off the event loop

    async def aput(self, owner: str, response: dict[str, Any], context: list[dict]) -> None:
        await off_loop(self.put, owner, response, context)

    async def aget(self, response_id: str, owner: str) -> StoredResponse | None:
        return await off_loop(self.get, response_id, owner)

    async def adelete(self, response_id: str, owner: str) -> bool:
        return await off_loop(self.delete, response_id, owner)
