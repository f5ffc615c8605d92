"""Regressions for what tests/server/test_fuzz.py found (no server needed; the live
reproducers run in test_fuzz.py against its server)."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import MODEL
from tokenmill.server.constraints import requested_constraints
from tokenmill.server.errors import APIError
from tokenmill.server.json_body import decode_json
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.server.state import sse

# The fuzzer's failing request was a chat completion whose guided_json schema held
# 4514280639357608525824: msgpack, which takes integers in [-2**63, 2**64), could not frame
# it for the engine core -> 500.
HUGE = 4514280639357608525824


def schema_fields(value: int) -> list[tuple[str, dict]]:
    schema = {"type": "integer", "maximum": value}
    return [
        ("guided_json", {"guided_json": schema}),
        ("guided_json", {"guided_json": f'{{"type": "integer", "maximum": {value}}}'}),
        ("structured_outputs", {"structured_outputs": {"json": {"anyOf": [schema]}}}),
        (
            "response_format",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": schema}}},
        ),
    ]


def parse_request(model, changes: dict):
    """As the server reads a body: strict JSON checks, then the request model."""
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    return model.model_validate(decode_json(json.dumps({**base, **changes}).encode()))


@pytest.mark.parametrize("value", [HUGE, 2**64, -(2**63) - 1])
@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_schema_integer_beyond_64_bits_is_400(model, value):
    for param, changes in schema_fields(value):
        with pytest.raises(APIError) as err:
            requested_constraints(parse_request(model, changes))
        assert err.value.status == 400 and err.value.param.startswith(param), err.value.message
        assert "64 bits" in err.value.message


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63)])
def test_schema_integer_within_64_bits_is_accepted(value):
    for param, changes in schema_fields(value):
        found = requested_constraints(parse_request(ChatCompletionRequest, changes))
        assert [p for p, _ in found] == [param]


def test_sse_data_has_no_line_break_a_client_would_split_on():
    """Raw U+2028 / U+2029 / U+0085 in a chunk split a `data:` line for clients that break
    SSE lines with str.splitlines (httpx / requests iter_lines)."""
    text = "a\u2028b\x85c\u2029d \u00e9"
    event = sse({"choices": [{"delta": {"content": text}}]})
    assert event.endswith("\n\n") and len(event.rstrip("\n").splitlines()) == 1
    assert json.loads(event.removeprefix("data: "))["choices"][0]["delta"]["content"] == text
