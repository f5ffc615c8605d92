"""Records: JSON round trips for the journal."""

from __future__ import annotations

import json

import pytest

from tests.gateway.store_helpers import guardrail, tool_call, usage
from tokenmill.gateway.store.records import (
    GuardrailEvent,
    ToolCallEvent,
    UsageRecord,
    record_from_json,
)


@pytest.mark.parametrize(
    "rec",
    [
        usage(1),
        usage(2, key_id=None, team=None, ttft_s=None, finish_reason=None, model="ünï\ncode"),
        guardrail("r", 0, matched_text='quote " and newline\n'),
        tool_call("r", 3, allowed=True, reason=None),
    ],
)
def test_round_trip(rec) -> None:
    line = rec.to_json()
    assert "\n" not in line and line.isascii()
    assert record_from_json(line) == rec
    assert type(rec).from_json(line) == rec


def test_columns_follow_fields() -> None:
    assert UsageRecord.COLUMNS[0] == "request_id" and UsageRecord.COLUMNS[-1] == "created"
    assert len(UsageRecord.COLUMNS) == 15
    assert "seq" in GuardrailEvent.COLUMNS and "id" not in ToolCallEvent.COLUMNS
    assert tool_call("r", 0, allowed=True).row()[ToolCallEvent.COLUMNS.index("allowed")] == 1


def test_wrong_kind_is_refused() -> None:
    with pytest.raises(ValueError):
        UsageRecord.from_json(guardrail("r", 0).to_json())
    with pytest.raises(ValueError):
        record_from_json(json.dumps({"t": "nope"}))
    with pytest.raises(TypeError):
        record_from_json(json.dumps({"t": "usage", "request_id": "x"}))
