"""The store's errors: a bad database URL, a schema newer than this code, a journal in use."""

from __future__ import annotations


class StoreError(RuntimeError):
    """Base of the gateway store's errors."""


class DatabaseUrlError(StoreError, ValueError):
    """A database URL that names no supported backend."""


class SchemaTooNewError(StoreError):
    """The database was migrated by a newer tokenmill than this one."""

    def __init__(self, db_version: int, code_version: int) -> None:
        super().__init__(
            f"database schema is version {db_version} but this tokenmill knows only up to "
            f"version {code_version}: upgrade tokenmill (or point it at another database)"
        )
        self.db_version = db_version
        self.code_version = code_version


class JournalLockedError(StoreError):
    """Another live process (or Ledger) holds the journal directory."""
