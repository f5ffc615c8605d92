"""The ledger: concurrency, idempotent replay, crash safety, outages, rejected rows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.gateway.postgres_server import ServerUnavailable, start_server
from tests.gateway.store_helpers import guardrail, tool_call, usage
from tokenmill.gateway.store import JournalLockedError, Ledger, LedgerConfig, StoreError
from tokenmill.gateway.store import queries as q
from tokenmill.gateway.store.database import open_database

FAST_RETRY = LedgerConfig(retry_initial_s=0.02, retry_max_s=0.1)
REPO = Path(__file__).resolve().parents[2]


def count(url: str, table: str = "usage") -> int:
    db = open_database(url)
    try:
        return db.fetchone(f"SELECT COUNT(*) FROM {table}")[0]
    finally:
        db.close()


def segments(journal: Path) -> list[Path]:
    return sorted(journal.glob("segment-*.jsonl"))


def test_many_threads_exact_rows_and_totals(db_url: str, tmp_path: Path) -> None:
    n_threads, per_thread = 8, 250
    recs = [usage(i, key_id=f"key-{i % 3}") for i in range(n_threads * per_thread)]
    with Ledger.open(db_url, tmp_path / "journal") as ledger:

        def work(k: int) -> None:
            for rec in recs[k::n_threads]:
                ledger.record(rec)
            ledger.record(guardrail(f"req-{k}", 0))
            ledger.record(tool_call(f"req-{k}", 0))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert ledger.flush(20)
        assert ledger.pending() == 0 and ledger.last_error is None
        got = q.totals(ledger.db)
        assert got["requests"] == 2000
        assert got["prompt_tokens"] == sum(r.prompt_tokens for r in recs)
        assert got["completion_tokens"] == sum(r.completion_tokens for r in recs)
        assert got["cached_tokens"] == sum(r.cached_tokens for r in recs)
        assert got["cost_usd"] == pytest.approx(sum(r.cost_usd for r in recs))
        key1 = q.totals(ledger.db, key_id="key-1")
        assert key1["requests"] == sum(1 for r in recs if r.key_id == "key-1")
    assert count(db_url, "guardrail_events") == n_threads
    assert count(db_url, "tool_call_events") == n_threads
    # every row committed: the journal keeps no segment
    assert segments(tmp_path / "journal") == []


def test_record_is_cheap(tmp_path: Path) -> None:
    with Ledger.open(str(tmp_path / "gw.sqlite3"), tmp_path / "journal") as ledger:
        rec = usage(0)
        start = time.perf_counter()
        for i in range(2000):
            ledger.record(rec if i == 0 else usage(i))
        per_call = (time.perf_counter() - start) / 2000
        assert ledger.flush()
    # generous for a busy 2-core machine; the database is never on this path
    assert per_call < 1e-3, f"{per_call * 1e6:.0f} us per record()"


def test_same_row_twice_lands_once(db_url: str, tmp_path: Path) -> None:
    with Ledger.open(db_url, tmp_path / "journal") as ledger:
        for _ in range(3):
            ledger.record(usage(1))
            ledger.record(guardrail("req-1", 0))
            ledger.record(tool_call("req-1", 0))
        ledger.record(guardrail("req-1", 1))  # a second event of the same request is kept
        assert ledger.flush()
    assert count(db_url) == 1
    assert count(db_url, "guardrail_events") == 2
    assert count(db_url, "tool_call_events") == 1


def test_replay_of_committed_journal_does_not_double(db_url: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    rows = [usage(i) for i in range(50)]
    with Ledger.open(db_url, journal) as ledger:
        for r in rows:
            ledger.record(r)
        assert ledger.flush()
    # a crash between commit and segment deletion leaves committed rows in the journal
    stale = "".join(r.to_json() + "\n" for r in rows[:30])
    (journal / "segment-000000000007.jsonl").write_text(stale + '{"t":"usage","request_')
    with Ledger.open(db_url, journal) as ledger:
        assert ledger.pending() == 30  # replayed (the torn last line is skipped)
        assert ledger.flush()
        ledger.record(usage(99))  # numbering continues after the replayed segment
        assert ledger.flush()
        assert q.totals(ledger.db)["requests"] == 51
    assert segments(journal) == []


CRASHER = """
import os, sys
from pathlib import Path
from tests.gateway.store_helpers import usage
from tokenmill.gateway.store import Ledger, LedgerConfig

url, journal, n = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
# a long linger: the writer is still gathering its first batch when we die
ledger = Ledger.open(url, journal, LedgerConfig(linger_s=5.0, batch_size=100_000,
                                                 segment_lines=n // 3))
for i in range(n):
    ledger.record(usage(i))
os.kill(os.getpid(), 9)
"""


def test_kill_9_loses_nothing(db_url: str, tmp_path: Path) -> None:
    n, journal = 600, tmp_path / "journal"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CRASHER), db_url, str(journal), str(n)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr
    assert count(db_url) < n  # the writer had not finished: the journal must supply the rest
    assert len(segments(journal)) >= 3
    with Ledger.open(db_url, journal) as ledger:
        assert ledger.flush()
        assert q.totals(ledger.db)["requests"] == n
        assert {r.request_id for r in q.usage_rows(ledger.db, limit=n)} == {
            f"req-{i}" for i in range(n)
        }
    assert segments(journal) == []


def test_journal_is_locked_while_open(tmp_path: Path) -> None:
    url = str(tmp_path / "gw.sqlite3")
    with Ledger.open(url, tmp_path / "journal") as ledger:
        with pytest.raises(JournalLockedError):
            Ledger.open(url, tmp_path / "journal")
        ledger.record(usage(1))
    with Ledger.open(url, tmp_path / "journal") as again:  # released by close()
        assert again.flush() and again.pending() == 0
    with pytest.raises(StoreError):
        again.record(usage(2))


def test_sqlite_outage_retries_then_lands(tmp_path: Path) -> None:
    url = str(tmp_path / "gw.sqlite3")
    ledger = Ledger.open(url, tmp_path / "journal", FAST_RETRY)
    other = open_database(url)
    other.fetchall("ALTER TABLE usage RENAME TO usage_away")  # inserts now fail
    for i in range(20):
        ledger.record(usage(i))
    assert not ledger.flush(timeout=0.5)
    assert ledger.pending() == 20 and ledger.errors > 0
    assert "usage" in (ledger.last_error or "")
    assert segments(tmp_path / "journal")  # still journaled
    other.fetchall("ALTER TABLE usage_away RENAME TO usage")
    assert ledger.flush(timeout=10)
    assert ledger.last_error is None and ledger.pending() == 0
    assert q.totals(ledger.db)["requests"] == 20
    ledger.close()
    other.close()


def test_close_during_outage_keeps_rows_for_next_open(tmp_path: Path) -> None:
    url, journal = str(tmp_path / "gw.sqlite3"), tmp_path / "journal"
    ledger = Ledger.open(url, journal, FAST_RETRY)
    other = open_database(url)
    other.fetchall("ALTER TABLE usage RENAME TO usage_away")
    for i in range(10):
        ledger.record(usage(i))
    assert ledger.close(timeout=0.3) is False
    other.fetchall("ALTER TABLE usage_away RENAME TO usage")
    other.close()
    with Ledger.open(url, journal) as ledger:
        assert ledger.flush()
        assert q.totals(ledger.db)["requests"] == 10


def test_postgres_outage_loses_nothing(tmp_path: Path) -> None:
    try:
        server = start_server()  # its own server: this test stops it
    except ServerUnavailable as e:
        pytest.skip(str(e))
    try:
        url = server.url()
        ledger = Ledger.open(url, tmp_path / "journal", FAST_RETRY)
        ledger.record(usage(0))
        assert ledger.flush()
        server.stop()
        for i in range(1, 101):
            ledger.record(usage(i))  # never blocks on the dead server
        assert not ledger.flush(timeout=0.5)
        assert ledger.last_error is not None and ledger.pending() == 100
        server.start()
        assert ledger.flush(timeout=20), ledger.last_error
        assert ledger.last_error is None
        assert q.totals(ledger.db)["requests"] == 101
        ledger.close()
    finally:
        server.destroy()


def test_refused_row_is_set_aside(db_url: str, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    with Ledger.open(db_url, journal, FAST_RETRY) as ledger:
        ledger.record(usage(1))
        ledger.record(guardrail(None, 0))  # request_id NOT NULL: the database refuses it
        ledger.record(usage(2))
        assert ledger.flush()
        assert ledger.rejected == 1
        assert q.totals(ledger.db)["requests"] == 2
    rejected = (journal / "rejected.jsonl").read_text().splitlines()
    assert len(rejected) == 1 and '"request_id":null' in rejected[0]
    assert segments(journal) == []
