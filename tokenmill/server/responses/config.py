"""Where and how long stored responses are kept, and the `serve` flags that set it."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from tokenmill.server.database import MEMORY, check_database, default_database_path

OFF = "off"
DAY_S = 86400.0


@dataclass(frozen=True)
class ResponseStoreConfig:
    # None: the server's database file (default_database_path()); ":memory:" keeps them until
    # the server stops; "off" stores nothing (GET / previous_response_id / background: 404 / 400)
    path: str | None = None
    ttl_s: float = 30 * DAY_S  # as OpenAI keeps responses for 30 days
    max_rows: int = 10_000
    max_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if not self.ttl_s > 0:
            raise ValueError("response-store-ttl: must be > 0")
        if self.max_rows < 1:
            raise ValueError("response-store-max-rows: must be >= 1")
        if self.max_bytes < 1:
            raise ValueError("response-store-max-mib: must be > 0")

    @property
    def enabled(self) -> bool:
        return self.path != OFF

    def database_path(self) -> str:
        return str(default_database_path()) if self.path is None else self.path


def add_response_store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--response-store",
        default=None,
        metavar="PATH",
        help="SQLite file of stored /v1/responses (default: the server database, "
        f"{default_database_path()}); '{MEMORY}' keeps them in memory, '{OFF}' stores none",
    )
    p.add_argument(
        "--response-store-ttl",
        type=float,
        default=ResponseStoreConfig.ttl_s,
        metavar="SECONDS",
        help="stored responses expire after this long (default: 30 days)",
    )
    p.add_argument(
        "--response-store-max-rows",
        type=int,
        default=ResponseStoreConfig.max_rows,
        metavar="N",
        help="at most this many stored responses; the oldest go first",
    )
    p.add_argument(
        "--response-store-max-mib",
        type=float,
        default=ResponseStoreConfig.max_bytes / 2**20,
        metavar="MIB",
        help="at most this much stored response data; the oldest go first",
    )


def response_store_config(args: argparse.Namespace) -> ResponseStoreConfig:
    """The flags' store, its file checked now (a clear error before the engine starts)."""
    config = ResponseStoreConfig(
        path=args.response_store,
        ttl_s=args.response_store_ttl,
        max_rows=args.response_store_max_rows,
        max_bytes=int(args.response_store_max_mib * 2**20),
    )
    if config.enabled:
        check_database(config.database_path(), "response-store")
    return config
