"""The ledger's journal: append-only JSON-lines segment files in one directory.

A record is appended (one write, flushed to the OS) before it is queued for the database, so
a killed process loses nothing `Ledger.record` returned from. A segment is deleted only once
every row in it is committed; until then a restart replays it, which the idempotent inserts
make harmless. An fcntl lock keeps two live ledgers off one directory (the kernel drops it
when a process dies, however it dies).
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from tokenmill.gateway.store.errors import JournalLockedError
from tokenmill.gateway.store.records import Record, record_from_json

log = logging.getLogger("tokenmill.gateway.store")

_PREFIX, _SUFFIX = "segment-", ".jsonl"


@dataclass
class Segment:
    """One journal file: `outstanding` rows written but not yet committed."""

    number: int
    path: Path
    fd: int | None = None  # open for appending while this is the active segment
    lines: int = 0
    outstanding: int = 0
    replayed: list[Record] = field(default_factory=list)


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"{_PREFIX}{number:012d}{_SUFFIX}"


def lock_directory(directory: Path) -> int:
    """Create `directory` and take its lock; returns the lock's fd (closing it unlocks)."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise JournalLockedError(
            f"ledger journal {directory} is in use by another ledger"
        ) from None
    return fd


def existing_segments(directory: Path) -> list[Segment]:
    """The segments left by earlier runs, oldest first, with their records read back.

    A line that does not parse (a write torn by a crash or a full disk) is logged and skipped."""
    segments = []
    for path in sorted(directory.glob(f"{_PREFIX}*{_SUFFIX}")):
        number = int(path.name[len(_PREFIX) : -len(_SUFFIX)])
        records: list[Record] = []
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    records.append(record_from_json(raw.decode()))
                except (ValueError, TypeError) as e:
                    log.warning(
                        "ledger journal %s:%d: skipping unreadable line (%s)", path, lineno, e
                    )
        seg = Segment(number, path, lines=len(records), outstanding=len(records))
        seg.replayed = records
        segments.append(seg)
    return segments


def open_segment(directory: Path, number: int) -> Segment:
    path = segment_path(directory, number)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    return Segment(number, path, fd=fd)


def append(seg: Segment, line: bytes) -> None:
    """Append one line with as many write() calls as it takes (one, in practice)."""
    assert seg.fd is not None
    view = memoryview(line)
    while view:
        view = view[os.write(seg.fd, view) :]
    seg.lines += 1
    seg.outstanding += 1


def seal(seg: Segment) -> None:
    """Stop appending to `seg` (it is deleted once its outstanding rows are committed)."""
    if seg.fd is not None:
        os.close(seg.fd)
        seg.fd = None


def remove(seg: Segment) -> None:
    seg.path.unlink(missing_ok=True)
