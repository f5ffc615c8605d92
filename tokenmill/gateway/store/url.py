"""Database URLs: parse `sqlite:///abs/path`, plain paths and `postgresql://...`; redact passwords."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from tokenmill.gateway.store.errors import DatabaseUrlError

_PG_SCHEMES = ("postgresql", "postgres")


@dataclass(frozen=True)
class DatabaseUrl:
    """A parsed URL: `dialect` is "sqlite" (with `path`) or "postgres" (with `dsn`)."""

    dialect: str
    path: Path | None = None
    dsn: str | None = None


def parse_url(url: str) -> DatabaseUrl:
    url = url.strip()
    if not url:
        raise DatabaseUrlError("empty database URL")
    if url == ":memory:" or url.endswith("/:memory:"):
        # each thread has its own connection, so each would see its own empty database
        raise DatabaseUrlError("in-memory SQLite is not supported: give a file path")
    scheme, sep, rest = url.partition("://")
    if not sep:
        return DatabaseUrl("sqlite", path=Path(url).expanduser().absolute())
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/":
            raise DatabaseUrlError(
                f"{redact_url(url)}: a sqlite URL takes an absolute path, e.g. sqlite:///var/db.sqlite3"
            )
        # sqlite:///abs and SQLAlchemy's sqlite:////abs both mean /abs
        return DatabaseUrl("sqlite", path=Path("/" + rest.lstrip("/")))
    if scheme in _PG_SCHEMES:
        return DatabaseUrl("postgres", dsn=url)
    raise DatabaseUrlError(
        f"{redact_url(url)}: unsupported database URL scheme {scheme!r} "
        "(use sqlite:///path, a file path, or postgresql://...)"
    )


def redact_url(url: str) -> str:
    """`url` with any password (in the netloc or a `password=` query item) replaced by ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable database URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:***@{hostport}" if colon else netloc
    query = parts.query
    if query:
        items = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if k.lower() == "password" else v) for k, v in items], safe="*"
        )
    if netloc != parts.netloc:
        url = url.replace(parts.netloc, netloc, 1)
    if query != parts.query:
        url = url.replace(parts.query, query, 1)
    return url
