"""CRUD on `api_keys`. Keys are generated and hashed by the caller; this stores sha256 hexes.

`updated` is strictly increasing across the table (a writer takes the table's write lock and
stamps max(now, newest + 1us)), so a server polling `keys_changed_since(max_updated)` never
misses a change committed by another process, such as the CLI.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields, replace
from typing import Any

from tokenmill.gateway.store.database import Database, Transaction

_TICK = 1e-6


@dataclass(frozen=True)
class StoredKey:
    """A row of `api_keys`; `models` None means every model."""

    id: str
    key_hash: str
    name: str | None = None
    team: str | None = None
    user_name: str | None = None
    models: tuple[str, ...] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None
    budget_usd: float | None = None
    budget_period: str | None = None  # 'day' | 'month' | 'total'
    tool_policy: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0  # 0: stamped by insert_key
    updated: float = 0.0
    expires_at: float | None = None
    revoked_at: float | None = None

    def usable(self, now: float | None = None) -> bool:
        """Neither revoked nor expired at `now`."""
        now = time.time() if now is None else now
        if self.revoked_at is not None and self.revoked_at <= now:
            return False
        return self.expires_at is None or now < self.expires_at


COLUMNS = tuple(f.name for f in fields(StoredKey))
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM api_keys"
# update_key may not touch these: identity, rotation (replace_hash) and the timestamps
_FIXED = frozenset({"id", "key_hash", "created", "updated"})


def _encode(name: str, value: Any) -> Any:
    if name == "models":
        return None if value is None else json.dumps(list(value))
    if name == "metadata":
        return json.dumps(value or {}, sort_keys=True)
    return value


def _decode(row: tuple) -> StoredKey:
    values = dict(zip(COLUMNS, row, strict=True))
    models = values["models"]
    values["models"] = None if models is None else tuple(json.loads(models))
    values["metadata"] = json.loads(values["metadata"]) if values["metadata"] else {}
    return StoredKey(**values)


def _next_updated(db: Database, tx: Transaction) -> float:
    """A stamp later than every `updated` so far (call inside the writing transaction)."""
    if db.dialect == "postgres":
        # writers queue here (readers are not blocked), so stamps commit in increasing order
        tx.execute("LOCK TABLE api_keys IN SHARE ROW EXCLUSIVE MODE")
    newest = tx.execute("SELECT MAX(updated) FROM api_keys")[0][0]
    now = time.time()
    return now if newest is None or now > newest else newest + _TICK


def insert_key(db: Database, key: StoredKey) -> StoredKey:
    """Store a new key (`created`/`updated` stamped when 0); returns the row as stored."""
    with db.transaction() as tx:
        stamp = _next_updated(db, tx)
        key = replace(key, created=key.created or stamp, updated=stamp)
        marks = ", ".join("?" * len(COLUMNS))
        tx.execute(
            f"INSERT INTO api_keys ({', '.join(COLUMNS)}) VALUES ({marks})",
            [_encode(c, getattr(key, c)) for c in COLUMNS],
        )
    return key


def get_key(db: Database, key_id: str) -> StoredKey | None:
    row = db.fetchone(f"{_SELECT} WHERE id = ?", (key_id,))
    return None if row is None else _decode(row)


def get_key_by_hash(db: Database, key_hash: str) -> StoredKey | None:
    """The key whose hash is `key_hash`, revoked or expired included (check `usable()`)."""
    row = db.fetchone(f"{_SELECT} WHERE key_hash = ?", (key_hash,))
    return None if row is None else _decode(row)


def list_keys(db: Database, include_revoked: bool = False) -> list[StoredKey]:
    where = "" if include_revoked else " WHERE revoked_at IS NULL"
    return [_decode(r) for r in db.fetchall(f"{_SELECT}{where} ORDER BY created, id")]


def _set(db: Database, key_id: str, values: dict[str, Any]) -> StoredKey | None:
    with db.transaction() as tx:
        values = {**values, "updated": _next_updated(db, tx)}
        assignments = ", ".join(f"{c} = ?" for c in values)
        params = [_encode(c, v) for c, v in values.items()]
        tx.execute(f"UPDATE api_keys SET {assignments} WHERE id = ?", (*params, key_id))
        rows = tx.execute(f"{_SELECT} WHERE id = ?", (key_id,))
    return _decode(rows[0]) if rows else None


def update_key(db: Database, key_id: str, **changes: Any) -> StoredKey | None:
    """Change a key's settings (any column but id, key_hash and the timestamps); bumps
    `updated`. Returns the new row, or None when there is no such key."""
    bad = sorted(set(changes) - (set(COLUMNS) - _FIXED))
    if bad:
        raise TypeError(f"update_key: cannot set {', '.join(bad)}")
    return _set(db, key_id, changes)


def replace_hash(db: Database, key_id: str, new_hash: str) -> StoredKey | None:
    """Rotate: the key keeps its id and settings, only the new secret's hash matches now."""
    return _set(db, key_id, {"key_hash": new_hash})


def revoke_key(db: Database, key_id: str, at: float | None = None) -> StoredKey | None:
    return _set(db, key_id, {"revoked_at": time.time() if at is None else at})


def max_updated(db: Database) -> float | None:
    """The newest `updated` stamp: poll it to notice another process's changes cheaply."""
    row = db.fetchone("SELECT MAX(updated) FROM api_keys")
    return None if row is None or row[0] is None else float(row[0])


def keys_changed_since(db: Database, updated_after: float | None) -> list[StoredKey]:
    """Keys (revoked ones included) changed after `updated_after` (None: every key), oldest
    change first."""
    if updated_after is None:
        rows = db.fetchall(f"{_SELECT} ORDER BY updated")
    else:
        rows = db.fetchall(f"{_SELECT} WHERE updated > ? ORDER BY updated", (updated_after,))
    return [_decode(r) for r in rows]
