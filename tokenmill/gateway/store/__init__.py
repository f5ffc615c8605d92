"""The gateway's persistence: database backends and migrations, the usage ledger (journal +
background writer), read-side queries and the API-key table."""

from tokenmill.gateway.store.database import Database, open_database
from tokenmill.gateway.store.errors import (
    DatabaseUrlError,
    JournalLockedError,
    SchemaTooNewError,
    StoreError,
)
from tokenmill.gateway.store.keys_table import StoredKey
from tokenmill.gateway.store.ledger import Ledger, LedgerConfig
from tokenmill.gateway.store.migrations import LATEST_VERSION, migrate, schema_version
from tokenmill.gateway.store.records import GuardrailEvent, Record, ToolCallEvent, UsageRecord
from tokenmill.gateway.store.url import redact_url

__all__ = [
    "LATEST_VERSION",
    "Database",
    "DatabaseUrlError",
    "GuardrailEvent",
    "JournalLockedError",
    "Ledger",
    "LedgerConfig",
    "Record",
    "SchemaTooNewError",
    "StoreError",
    "StoredKey",
    "ToolCallEvent",
    "UsageRecord",
    "migrate",
    "open_database",
    "redact_url",
    "schema_version",
]
