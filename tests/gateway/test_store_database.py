"""Database URLs, backends and migrations, on SQLite and a real PostgreSQL."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tokenmill.gateway.store import (
    LATEST_VERSION,
    DatabaseUrlError,
    Ledger,
    SchemaTooNewError,
    migrate,
    open_database,
    redact_url,
    schema_version,
)
from tokenmill.gateway.store.database import Database, PostgresDatabase, SqliteDatabase


def indexes(db: Database) -> set[str]:
    if db.dialect == "sqlite":
        rows = db.fetchall("SELECT name FROM sqlite_master WHERE type = 'index'")
    else:
        rows = db.fetchall("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")
    return {r[0] for r in rows}


def tables(db: Database) -> set[str]:
    if db.dialect == "sqlite":
        rows = db.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        rows = db.fetchall("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {r[0] for r in rows}


def test_urls_pick_the_backend(tmp_path: Path) -> None:
    db = open_database(f"sqlite:///{tmp_path}/a.sqlite3")
    assert isinstance(db, SqliteDatabase) and db.path == tmp_path / "a.sqlite3"
    plain = open_database(str(tmp_path / "b.db"))
    assert isinstance(plain, SqliteDatabase) and plain.path == tmp_path / "b.db"
    assert isinstance(open_database("postgresql://u:p@localhost:1/x"), PostgresDatabase)
    assert isinstance(open_database("postgres://localhost/x"), PostgresDatabase)
    for bad in (":memory:", "sqlite:///:memory:", "sqlite://relative.db", "mysql://h/db", " "):
        with pytest.raises(DatabaseUrlError):
            open_database(bad)


def test_redact_url_hides_passwords_only() -> None:
    assert redact_url("postgresql://bob:s3cret@db:5432/gw") == "postgresql://bob:***@db:5432/gw"
    assert redact_url("postgresql://db/gw?password=s3cret&sslmode=require") == (
        "postgresql://db/gw?password=***&sslmode=require"
    )
    assert redact_url("postgresql://bob@db/gw") == "postgresql://bob@db/gw"
    assert redact_url("sqlite:///var/gw.sqlite3") == "sqlite:///var/gw.sqlite3"
    db = open_database("postgresql://bob:s3cret@db/gw")
    assert "s3cret" not in repr(db)
    with pytest.raises(DatabaseUrlError) as e:
        open_database("mysql://bob:s3cret@db/gw")
    assert "s3cret" not in str(e.value)


def test_sqlite_pragmas(tmp_path: Path) -> None:
    db = open_database(str(tmp_path / "deep" / "dir" / "gw.sqlite3"))  # parents are created
    assert db.fetchone("PRAGMA journal_mode") == ("wal",)
    assert db.fetchone("PRAGMA synchronous") == (1,)  # NORMAL
    assert db.fetchone("PRAGMA busy_timeout")[0] >= 1000
    db.close()


def test_connection_per_thread(tmp_path: Path) -> None:
    db = open_database(str(tmp_path / "gw.sqlite3"))
    seen = []
    t = threading.Thread(target=lambda: seen.append(db.connection()))
    t.start()
    t.join()
    assert seen[0] is not db.connection()
    assert db.connection() is db.connection()
    db.close()


def test_migrate_fresh_then_no_op(db_url: str) -> None:
    db = open_database(db_url)
    assert schema_version(db) == 0
    assert migrate(db) == (0, LATEST_VERSION)
    assert {"api_keys", "usage", "guardrail_events", "tool_call_events"} <= tables(db)
    assert {"usage_key_created", "usage_team_created", "usage_created"} <= indexes(db)
    assert migrate(db) == (LATEST_VERSION, LATEST_VERSION)
    assert db.fetchone("SELECT COUNT(*) FROM schema_version") == (LATEST_VERSION,)
    db.close()


def test_migrate_upgrades_step_by_step(db_url: str) -> None:
    db = open_database(db_url)
    assert migrate(db, target=1) == (0, 1)
    assert "usage_key_created" in indexes(db) and "usage_created" not in indexes(db)
    assert migrate(db, target=2) == (1, 2)
    assert "usage_created" in indexes(db)
    # v3 erases the matched text that guardrail events stored before it
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO guardrail_events (request_id, key_id, seq, stage, rule, action, "
            "matched_text, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            ("r1", "k1", 0, "input", "emails", "redact", "jane.doe@example.com", 1.0),
        )
    assert migrate(db) == (2, 3)
    assert db.fetchall("SELECT rule, matched_text FROM guardrail_events") == [("emails", None)]
    with pytest.raises(ValueError):
        migrate(db, target=LATEST_VERSION + 1)
    db.close()


def test_concurrent_migrations_apply_once(db_url: str) -> None:
    results, errors = [], []

    def run() -> None:
        db = open_database(db_url)  # its own connection, as another process would have
        try:
            results.append(migrate(db))
        except Exception as e:
            errors.append(e)
        finally:
            db.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(results) == [(0, LATEST_VERSION)] + [(LATEST_VERSION, LATEST_VERSION)] * 3


def test_newer_database_is_refused(db_url: str, tmp_path: Path) -> None:
    db = open_database(db_url)
    migrate(db)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO schema_version (version, description, applied) VALUES (?, ?, ?)",
            (LATEST_VERSION + 1, "from the future", 0.0),
        )
    with pytest.raises(SchemaTooNewError) as e:
        migrate(db)
    assert e.value.db_version == LATEST_VERSION + 1
    assert "upgrade tokenmill" in str(e.value)
    with pytest.raises(SchemaTooNewError):
        Ledger.open(db_url, tmp_path / "journal")
    db.close()


def test_transaction_rolls_back_on_error(db_url: str) -> None:
    db = open_database(db_url)
    migrate(db)
    with pytest.raises(RuntimeError), db.transaction() as tx:
        tx.execute("INSERT INTO usage (request_id, created) VALUES (?, ?)", ("r1", 1.0))
        raise RuntimeError("abort")
    assert db.fetchone("SELECT COUNT(*) FROM usage") == (0,)
    with db.transaction() as tx:  # the connection is still usable
        tx.execute("INSERT INTO usage (request_id, created) VALUES (?, ?)", ("r2", 1.0))
    assert db.fetchone("SELECT request_id FROM usage") == ("r2",)
    db.close()
