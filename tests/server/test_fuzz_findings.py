"""Regressions for what tests/server/test_fuzz.py found (no server needed; the live
reproducers run in test_fuzz.py against its server)."""

from __future__ import annotations

import pytest

from tests.server.conftest import MODEL
from tokenmill.server.constraints import requested_constraints
from tokenmill.server.errors import APIError
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest

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


@pytest.mark.parametrize("value", [HUGE, 2**64, -(2**63) - 1])
@pytest.mark.parametrize("model", [ChatCompletionRequest, CompletionRequest])
def test_schema_integer_beyond_64_bits_is_400(model, value):
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    for param, changes in schema_fields(value):
        req = model.model_validate({**base, **changes})
        with pytest.raises(APIError) as err:
            requested_constraints(req)
        assert (err.value.status, err.value.param) == (400, param), err.value.message
        assert "64 bits" in err.value.message


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63)])
def test_schema_integer_within_64_bits_is_accepted(value):
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    for param, changes in schema_fields(value):
        found = requested_constraints(ChatCompletionRequest.model_validate({**base, **changes}))
        assert [p for p, _ in found] == [param]
