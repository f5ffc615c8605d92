"""Schema migrations: an ordered list, applied under a lock so concurrent processes are safe.

`schema_version` holds one row per applied migration; the schema's version is its maximum.
SQLite serializes through BEGIN IMMEDIATE, PostgreSQL through a transaction-scoped advisory
lock; both run DDL transactionally, so a migration is applied whole or not at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tokenmill.gateway.store import schema
from tokenmill.gateway.store.database import Database, Transaction
from tokenmill.gateway.store.errors import SchemaTooNewError


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "api_keys, usage, guardrail_events, tool_call_events", schema.V1),
    Migration(2, "time-range indexes", schema.V2),
    Migration(3, "guardrail events keep a masked match, never the matched text", schema.V3),
)
LATEST_VERSION = MIGRATIONS[-1].version

# pg_advisory_xact_lock key: arbitrary, fixed ("tokmill" in ASCII)
_PG_LOCK_KEY = 0x746F6B6D696C6C

_CREATE_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_version "
    "(version INTEGER PRIMARY KEY, description TEXT, applied {real} NOT NULL)"
)


def _current(tx: Transaction) -> int:
    rows = tx.execute("SELECT MAX(version) FROM schema_version")
    return int(rows[0][0] or 0)


def schema_version(db: Database) -> int:
    """The database's schema version (0 when never migrated)."""
    with db.transaction() as tx:
        tx.execute(db.ddl(_CREATE_VERSION_TABLE))
        return _current(tx)


def migrate(db: Database, target: int | None = None) -> tuple[int, int]:
    """Bring the schema up to `target` (default: the latest); returns (from, to) versions.

    Idempotent, and safe when several processes run it at once. Raises SchemaTooNewError when
    the database is newer than this code knows."""
    target = LATEST_VERSION if target is None else target
    if not 0 <= target <= LATEST_VERSION:
        raise ValueError(f"no migration to version {target} (latest is {LATEST_VERSION})")
    with db.transaction() as tx:
        if db.dialect == "postgres":
            tx.execute("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK_KEY,))
        tx.execute(db.ddl(_CREATE_VERSION_TABLE))
        current = _current(tx)
        if current > LATEST_VERSION:
            raise SchemaTooNewError(current, LATEST_VERSION)
        for m in MIGRATIONS:
            if current < m.version <= target:
                for stmt in m.statements:
                    tx.execute(db.ddl(stmt))
                tx.execute(
                    "INSERT INTO schema_version (version, description, applied) VALUES (?, ?, ?)",
                    (m.version, m.description, time.time()),
                )
        return current, max(current, target)
