"""Stored files (/v1/files): the bytes on disk in the files directory, the metadata in the
server's SQLite file. Blocking methods: the routes call them off the event loop."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenmill.server.database import Database
from tokenmill.server.errors import APIError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    path TEXT NOT NULL,
    lines INTEGER NOT NULL,
    urls TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS batch_files_owner ON batch_files (owner, created_at);
"""
FILE_ID = r"^file-[0-9a-f]{24}$"


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


@dataclass(frozen=True)
class FileRecord:
    id: str
    owner: str
    created_at: int
    purpose: str  # "batch" (uploaded) or "batch_output"
    filename: str
    bytes: int
    path: str
    lines: int  # requests in a batch input file
    urls: tuple[str, ...]  # the endpoints its lines call

    def to_dict(self) -> dict[str, Any]:
        """OpenAI's FileObject."""
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


def _record(row: tuple) -> FileRecord:
    return FileRecord(*row[:8], tuple(json.loads(row[8])))


class FileStore:
    def __init__(self, db: Database, directory: Path, max_total_bytes: int) -> None:
        self.db = db
        self.dir = directory
        self.max_total_bytes = max_total_bytes
        directory.mkdir(parents=True, exist_ok=True)
        db.call(lambda conn: conn.executescript(_SCHEMA))

    def new_path(self, file_id: str) -> Path:
        return self.dir / f"{file_id}.jsonl"

    def add(self, record: FileRecord, enforce_cap: bool = True) -> None:
        """Keeps the record; 413 (nothing kept) when all files together would pass the cap
        (not checked for a batch's output: its results are never dropped)."""
        r = record
        row = (
            r.id, r.owner, r.created_at, r.purpose, r.filename, r.bytes, r.path, r.lines,
            json.dumps(list(r.urls)),
        )  # fmt: skip

        def write(conn) -> None:
            total = conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM batch_files").fetchone()[0]
            if enforce_cap and total + record.bytes > self.max_total_bytes:
                raise APIError(
                    413, f"file storage is full ({self.max_total_bytes} bytes); delete files",
                    "invalid_request_error", "file", "storage_limit_exceeded",
                )  # fmt: skip
            conn.execute("INSERT INTO batch_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

        self.db.transaction(write)

    def create(
        self,
        owner: str,
        path: Path,
        purpose: str,
        filename: str,
        lines: int,
        urls: tuple[str, ...],
        enforce_cap: bool = True,
    ) -> FileRecord:
        """A record for a file already written at self.new_path(its id)."""
        record = FileRecord(
            path.stem, owner, int(time.time()), purpose, filename, path.stat().st_size,
            str(path), lines, urls,
        )  # fmt: skip
        self.add(record, enforce_cap)
        return record

    def get(self, file_id: str, owner: str) -> FileRecord | None:
        """None when missing or someone else's (the caller cannot tell which)."""
        row = self.db.call(
            lambda conn: conn.execute(
                "SELECT * FROM batch_files WHERE id = ? AND owner = ?", (file_id, owner)
            ).fetchone()
        )
        return None if row is None else _record(row)

    def list(
        self, owner: str, purpose: str | None, limit: int, after: str | None, order: str
    ) -> tuple[list[FileRecord], bool]:
        """A page of the owner's files (by creation, `order` asc or desc) and whether more
        follow; `after` a file id of the previous page."""
        op, direction = (">", "ASC") if order == "asc" else ("<", "DESC")
        sql = "SELECT * FROM batch_files WHERE owner = ?"
        args: list[Any] = [owner]
        if purpose is not None:
            sql += " AND purpose = ?"
            args.append(purpose)
        if after is not None:
            sql += f" AND rowid {op} COALESCE((SELECT rowid FROM batch_files WHERE id = ?), -1)"
            args.append(after)
        sql += f" ORDER BY rowid {direction} LIMIT ?"
        args.append(limit + 1)
        rows = self.db.call(lambda conn: conn.execute(sql, args).fetchall())
        return [_record(r) for r in rows[:limit]], len(rows) > limit

    def delete(self, file_id: str, owner: str) -> FileRecord | None:
        """Forgets the file and removes its bytes; None when there is no such file."""
        record = self.get(file_id, owner)
        if record is None:
            return None
        self.db.transaction(
            lambda conn: conn.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))
        )
        Path(record.path).unlink(missing_ok=True)
        return record
