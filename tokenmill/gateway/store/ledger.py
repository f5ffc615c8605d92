"""The usage ledger: `record()` journals a row and queues it; a writer thread inserts in batches.

`record()` runs on the server's event loop for every request, so it only appends one line to
the journal (flushed to the OS) and puts the row on a queue: microseconds, and never the
database. The writer thread inserts batches (one transaction each, `ON CONFLICT DO NOTHING`,
so a replayed or retried row never doubles), then deletes journal segments whose rows are all
committed. When the database is down the writer retries with backoff and the rows wait, in
the journal and in memory: both grow with the outage (about 300 bytes a row), and nothing is
lost or the server slowed. A row the database rejects outright (not an outage: a constraint
or type error) is moved to `rejected.jsonl` in the journal directory and logged, so it cannot
stall the rows behind it.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tokenmill.gateway.store import journal
from tokenmill.gateway.store.database import Database, open_database
from tokenmill.gateway.store.errors import StoreError
from tokenmill.gateway.store.journal import Segment
from tokenmill.gateway.store.migrations import migrate
from tokenmill.gateway.store.records import Record
from tokenmill.gateway.store.url import redact_url

log = logging.getLogger("tokenmill.gateway.store")

_Item = tuple[Segment, Record]


@dataclass(frozen=True)
class LedgerConfig:
    batch_size: int = 500  # rows per transaction at most
    linger_s: float = 0.02  # after a first row, wait this long for more to batch with it
    segment_lines: int = 10_000  # start a new journal segment after this many lines
    retry_initial_s: float = 0.1  # backoff while the database fails: doubles up to the max
    retry_max_s: float = 5.0


def insert_sql(cls: type[Record]) -> str:
    cols = ", ".join(cls.COLUMNS)
    marks = ", ".join("?" * len(cls.COLUMNS))
    return f"INSERT INTO {cls.TABLE} ({cols}) VALUES ({marks}) ON CONFLICT DO NOTHING"


def is_transient(e: BaseException) -> bool:
    """Whether `e` is the database being unreachable or busy (retry) rather than a bad row."""
    if isinstance(e, sqlite3.OperationalError):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(e, psycopg.OperationalError | psycopg.InterfaceError)


class Ledger:
    """Durable, non-blocking usage/event recording; see the module docstring."""

    def __init__(self, db: Database, journal_dir: Path, config: LedgerConfig | None = None) -> None:
        """Use `Ledger.open`; this expects a migrated `db` and takes ownership of it."""
        self.db = db
        self.config = config or LedgerConfig()
        self.journal_dir = Path(journal_dir)
        self.last_error: str | None = None  # the writer's latest failure; None once it recovers
        self.errors = 0  # failed insert attempts so far
        self.rejected = 0  # rows moved to rejected.jsonl
        self._lock_fd = journal.lock_directory(self.journal_dir)
        self._lock = threading.Lock()
        self._committed_cond = threading.Condition(self._lock)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._segments: dict[int, Segment] = {}
        self._active: Segment | None = None
        self._recorded = 0
        self._committed = 0
        self._closing = False
        self._stop = threading.Event()
        self._next_number = 1
        self._replay()
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, url: str, journal_path: Path | str, config: LedgerConfig | None = None) -> Ledger:
        """Migrate the database at `url`, queue what `journal_path` (a directory) holds from
        an earlier run ahead of any new row, and start the writer."""
        db = open_database(url)
        try:
            migrate(db)
            return cls(db, Path(journal_path), config)
        except BaseException:
            db.close()
            raise

    def __repr__(self) -> str:
        return f"Ledger({redact_url(self.db.url)!r}, {str(self.journal_dir)!r})"

    # --- the event loop's side ---------------------------------------------------------

    def record(self, item: Record) -> None:
        """Journal `item` and queue it for the database; returns once the line is with the OS."""
        line = (item.to_json() + "\n").encode()
        with self._lock:
            if self._closing:
                raise StoreError("ledger is closed")
            seg = self._active
            if seg is None or seg.lines >= self.config.segment_lines:
                if seg is not None:
                    journal.seal(seg)
                seg = self._active = journal.open_segment(self.journal_dir, self._next_number)
                self._segments[seg.number] = seg
                self._next_number += 1
            journal.append(seg, line)
            self._recorded += 1
            self._queue.put((seg, item))

    def pending(self) -> int:
        """Rows recorded (or replayed) but not yet committed."""
        return self._recorded - self._committed

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every row recorded so far is committed; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._recorded
            while self._committed < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._committed_cond.wait(min(left, 0.5))
            return True

    def close(self, timeout: float = 10.0) -> bool:
        """Flush (up to `timeout`), stop the writer and release the database and journal.

        Returns whether everything was committed; what was not stays in the journal for the
        next `Ledger.open`."""
        if self._stop.is_set():
            return True
        flushed = self.flush(timeout)
        with self._lock:
            self._closing = True
        self._stop.set()
        self._queue.put(None)
        self._thread.join()
        with self._lock:
            for seg in self._segments.values():
                journal.seal(seg)
        self.db.close()
        os.close(self._lock_fd)
        return flushed

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # --- start-up ----------------------------------------------------------------------

    def _replay(self) -> None:
        replayed = 0
        for seg in journal.existing_segments(self.journal_dir):
            self._next_number = max(self._next_number, seg.number + 1)
            if not seg.replayed:
                journal.remove(seg)
                continue
            self._segments[seg.number] = seg
            for rec in seg.replayed:
                self._queue.put((seg, rec))
            replayed += len(seg.replayed)
            seg.replayed = []
        self._recorded += replayed
        if replayed:
            log.info("ledger: replaying %d journaled rows from %s", replayed, self.journal_dir)

    # --- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            batch = self._take()
            if not batch or not self._insert_with_retry(batch):
                return
            self._committed_batch(batch)

    def _take(self) -> list[_Item]:
        first = self._queue.get()
        if first is None:
            return []
        batch = [first]
        deadline = time.monotonic() + self.config.linger_s
        while len(batch) < self.config.batch_size:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:  # close() is stopping us: commit what we hold first
                self._queue.put(None)
                break
            batch.append(item)
        return batch

    def _insert_with_retry(self, batch: list[_Item]) -> bool:
        delay = self.config.retry_initial_s
        while True:
            try:
                self._insert(batch)
            except Exception as e:
                if not is_transient(e):
                    try:
                        self._insert_one_by_one(batch)
                    except Exception as e2:  # transient after all: retry the batch
                        e = e2
                    else:
                        return True
                self._failed(e)
                if self._stop.wait(delay):
                    return False
                delay = min(delay * 2, self.config.retry_max_s)
            else:
                if self.last_error is not None:
                    log.warning("ledger: database writes recovered")
                    self.last_error = None
                return True

    def _insert(self, batch: list[_Item]) -> None:
        groups: dict[type[Record], list[tuple]] = {}
        for _, rec in batch:
            groups.setdefault(type(rec), []).append(rec.row())
        with self.db.transaction() as tx:
            for cls, rows in groups.items():
                tx.executemany(insert_sql(cls), rows)

    def _insert_one_by_one(self, batch: list[_Item]) -> None:
        """Insert row by row, moving the rows the database refuses to rejected.jsonl."""
        for _, rec in batch:
            try:
                with self.db.transaction() as tx:
                    tx.execute(insert_sql(type(rec)), rec.row())
            except Exception as e:
                if is_transient(e):
                    raise
                log.error("ledger: the database refused a row, moved to rejected.jsonl: %s", e)
                with open(self.journal_dir / "rejected.jsonl", "a") as f:
                    f.write(rec.to_json() + "\n")
                self.rejected += 1

    def _failed(self, e: Exception) -> None:
        if self.last_error is None:
            log.warning(
                "ledger: database write failed (%s), retrying; %d rows pending in %s",
                e,
                self.pending(),
                self.journal_dir,
            )
        self.last_error = f"{type(e).__name__}: {e}".strip()
        self.errors += 1
        self.db.reset_connection()

    def _committed_batch(self, batch: list[_Item]) -> None:
        done: dict[int, Segment] = {}
        with self._lock:
            for seg, _ in batch:
                seg.outstanding -= 1
                if seg.outstanding == 0:
                    done[seg.number] = seg
            active = self._active
            if active is not None and active.outstanding == 0:
                # idle: retire the active segment too, so a quiet journal empties
                journal.seal(active)
                self._active = None
            for number, seg in list(done.items()):
                if seg is self._active:
                    del done[number]
                else:
                    self._segments.pop(number, None)
            self._committed += len(batch)
            self._committed_cond.notify_all()
        for seg in done.values():
            journal.remove(seg)
