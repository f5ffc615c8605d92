"""The ledger's rows as frozen dataclasses, with one-line JSON for the journal.

Each class names its table and columns (field order = column order), so the ledger inserts
any of them generically. A journal line is a JSON object whose "t" says which class it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="_Row")


class _Row:
    TABLE: ClassVar[str]
    KIND: ClassVar[str]
    COLUMNS: ClassVar[tuple[str, ...]]

    def row(self) -> tuple[Any, ...]:
        """The column values, in COLUMNS order."""
        return tuple(getattr(self, c) for c in self.COLUMNS)

    def to_json(self) -> str:
        """One line of JSON (ASCII, no newline inside)."""
        obj: dict[str, Any] = {"t": self.KIND}
        obj.update(zip(self.COLUMNS, self.row(), strict=True))
        return json.dumps(obj, separators=(",", ":"))

    @classmethod
    def from_json(cls: type[R], line: str) -> R:
        obj = json.loads(line)
        kind = obj.pop("t", None)
        if kind != cls.KIND:
            raise ValueError(f"journal line of kind {kind!r} is not a {cls.__name__}")
        return cls(**obj)


def _columns(cls: type) -> type:
    cls.COLUMNS = tuple(f.name for f in fields(cls))
    return cls


@_columns
@dataclass(frozen=True, slots=True)
class UsageRecord(_Row):
    """One request's usage and cost (a row of `usage`); `request_id` makes it idempotent."""

    TABLE: ClassVar[str] = "usage"
    KIND: ClassVar[str] = "usage"

    request_id: str
    key_id: str | None
    team: str | None
    user_name: str | None
    model: str
    endpoint: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_usd: float
    ttft_s: float | None
    latency_s: float
    status: int
    finish_reason: str | None
    created: float


@_columns
@dataclass(frozen=True, slots=True)
class GuardrailEvent(_Row):
    """A guardrail rule that fired; (request_id, stage, rule, seq) makes it idempotent."""

    TABLE: ClassVar[str] = "guardrail_events"
    KIND: ClassVar[str] = "guardrail"

    request_id: str
    key_id: str | None
    seq: int
    stage: str  # 'input' | 'output'
    rule: str
    action: str
    matched_text: str
    created: float


@_columns
@dataclass(frozen=True, slots=True)
class ToolCallEvent(_Row):
    """A tool call and the policy's verdict; (request_id, seq) makes it idempotent."""

    TABLE: ClassVar[str] = "tool_call_events"
    KIND: ClassVar[str] = "tool_call"

    request_id: str
    key_id: str | None
    seq: int
    tool_name: str
    arguments: str  # the call's arguments as the model wrote them (a JSON string)
    allowed: bool
    reason: str | None
    created: float

    def row(self) -> tuple[Any, ...]:
        # stored as INTEGER 0/1 (PostgreSQL will not cast a boolean into an integer column)
        values = _Row.row(self)
        i = self.COLUMNS.index("allowed")
        return (*values[:i], int(values[i]), *values[i + 1 :])


Record = UsageRecord | GuardrailEvent | ToolCallEvent
RECORD_TYPES: tuple[type[Record], ...] = (UsageRecord, GuardrailEvent, ToolCallEvent)
_BY_KIND: dict[str, type[Record]] = {t.KIND: t for t in RECORD_TYPES}


def record_from_json(line: str) -> Record:
    """Any record from its journal line."""
    obj = json.loads(line)
    cls = _BY_KIND.get(obj.pop("t", None))
    if cls is None:
        raise ValueError(f"not a ledger record: {line[:80]!r}")
    return cls(**obj)
