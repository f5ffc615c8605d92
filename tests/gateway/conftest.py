"""Fixtures for the gateway store tests: a database URL per backend (SQLite file, real
PostgreSQL started by the tests)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.gateway.postgres_server import PostgresServer, ServerUnavailable, start_server

_db_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (tests get fresh databases on it)."""
    try:
        server = start_server()
    except ServerUnavailable as e:
        print(f"PostgreSQL tests skipped: {e}")
        pytest.skip(str(e))
    yield server
    server.destroy()


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    return pg_server.create_database(f"t{next(_db_names)}")


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh, empty database's URL, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gateway.sqlite3'}"
    return request.getfixturevalue("pg_url")
