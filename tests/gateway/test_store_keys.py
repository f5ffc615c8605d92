"""The api_keys table: CRUD, rotation, revocation, change polling across connections."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator

import pytest

from tokenmill.gateway.store import StoredKey, migrate, open_database
from tokenmill.gateway.store import keys_table as kt
from tokenmill.gateway.store.database import Database

try:
    import psycopg

    INTEGRITY_ERRORS: tuple[type[Exception], ...] = (
        sqlite3.IntegrityError,
        psycopg.IntegrityError,
    )
except ImportError:  # the PostgreSQL runs skip
    INTEGRITY_ERRORS = (sqlite3.IntegrityError,)


def h(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    db = open_database(db_url)
    migrate(db)
    yield db
    db.close()


def test_insert_and_get(db: Database) -> None:
    key = StoredKey(
        id="k1", key_hash=h("sk-1"), name="ci", team="red", user_name="alice",
        models=("tiny", "big"), rpm=60, tpm=10_000, max_parallel=4, budget_usd=12.5,
        budget_period="month", tool_policy="strict", metadata={"owner": "ops", "n": 1},
        expires_at=2e9,
    )  # fmt: skip
    stored = kt.insert_key(db, key)
    assert stored.created > 0 and stored.updated >= stored.created
    assert kt.get_key(db, "k1") == stored
    assert kt.get_key_by_hash(db, h("sk-1")) == stored
    assert kt.get_key_by_hash(db, h("sk-other")) is None
    assert kt.get_key(db, "nope") is None
    plain = kt.insert_key(db, StoredKey(id="k2", key_hash=h("sk-2")))
    assert plain.models is None and plain.metadata == {}
    assert kt.get_key(db, "k2") == plain
    with pytest.raises(INTEGRITY_ERRORS):
        kt.insert_key(db, StoredKey(id="k3", key_hash=h("sk-1")))  # same secret twice


def test_update_rotate_revoke(db: Database) -> None:
    k = kt.insert_key(db, StoredKey(id="k1", key_hash=h("old"), rpm=10))
    updated = kt.update_key(db, "k1", rpm=20, models=["a"], metadata={"x": [1]})
    assert updated is not None
    assert (updated.rpm, updated.models, updated.metadata) == (20, ("a",), {"x": [1]})
    assert updated.updated > k.updated and updated.created == k.created
    assert kt.update_key(db, "k1", models=None).models is None
    with pytest.raises(TypeError):
        kt.update_key(db, "k1", key_hash="x")
    with pytest.raises(TypeError):
        kt.update_key(db, "k1", colour="blue")
    assert kt.update_key(db, "missing", rpm=1) is None

    rotated = kt.replace_hash(db, "k1", h("new"))
    assert rotated is not None and rotated.id == "k1" and rotated.rpm == 20
    assert kt.get_key_by_hash(db, h("old")) is None
    assert kt.get_key_by_hash(db, h("new")).id == "k1"

    kt.insert_key(db, StoredKey(id="k2", key_hash=h("two")))
    revoked = kt.revoke_key(db, "k1", at=1000.0)
    assert revoked.revoked_at == 1000.0 and not revoked.usable(now=1001.0)
    assert kt.get_key_by_hash(db, h("new")).revoked_at == 1000.0  # still found: caller checks
    assert [k.id for k in kt.list_keys(db)] == ["k2"]
    assert [k.id for k in kt.list_keys(db, include_revoked=True)] == ["k1", "k2"]
    assert kt.revoke_key(db, "missing") is None


def test_usable() -> None:
    k = StoredKey(id="k", key_hash="h", expires_at=100.0)
    assert k.usable(now=99.0) and not k.usable(now=100.0)
    assert not StoredKey(id="k", key_hash="h", revoked_at=5.0).usable(now=6.0)
    assert StoredKey(id="k", key_hash="h").usable()


def test_polling_sees_another_connections_changes(db_url: str, db: Database) -> None:
    cli = open_database(db_url)  # another process's view, e.g. the keys CLI
    try:
        assert kt.max_updated(db) is None
        kt.insert_key(cli, StoredKey(id="k1", key_hash=h("1")))
        kt.insert_key(cli, StoredKey(id="k2", key_hash=h("2")))
        assert [k.id for k in kt.keys_changed_since(db, None)] == ["k1", "k2"]
        mark = kt.max_updated(db)
        assert kt.keys_changed_since(db, mark) == []
        kt.revoke_key(cli, "k1")
        changed = kt.keys_changed_since(db, mark)
        assert [k.id for k in changed] == ["k1"] and changed[0].revoked_at is not None
        # stamps strictly increase even for changes within one clock tick
        stamps = [kt.update_key(cli, "k2", rpm=i).updated for i in range(20)]
        assert stamps == sorted(set(stamps))
        assert kt.max_updated(db) == stamps[-1]
    finally:
        cli.close()
