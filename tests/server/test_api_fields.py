"""docs/api-fields.md and the code agree: every field of every request model is listed there,
every field listed as rejected is a 400 naming it (with the doc's example value), and the
ignored ones are accepted. `conversation` and `prompt` on /v1/responses used to be dropped
without a word (a 200 that had lost the client's context)."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.server.conftest import MODEL
from tests.server.test_hardening import assert_400, post
from tokenmill.server.batch.protocol import BatchCreateRequest
from tokenmill.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from tokenmill.server.responses.protocol import ResponsesRequest

DOC = Path(__file__).parents[2] / "docs" / "api-fields.md"
MODELS: dict[str, type[BaseModel] | None] = {
    "POST /v1/chat/completions": ChatCompletionRequest,
    "POST /v1/completions": CompletionRequest,
    "POST /v1/responses": ResponsesRequest,
    "POST /tokenize": TokenizeRequest,
    "POST /detokenize": DetokenizeRequest,
    "POST /v1/batches": BatchCreateRequest,
    "POST /v1/files": None,  # multipart
}
# a request each endpoint answers 200, which a row's field is set in
BASES: dict[str, dict[str, Any]] = {
    "POST /v1/chat/completions": {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
    },
    "POST /v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1},
    "POST /v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 1, "store": False},
    "POST /tokenize": {"model": MODEL, "prompt": "hi"},
}  # fmt: skip


@dataclass(frozen=True)
class Row:
    endpoint: str
    field: str
    handling: str  # supported | rejected | ignored
    example: str | None  # JSON


def doc_rows() -> list[Row]:
    """The tables' rows, one per endpoint a section's heading names."""
    rows: list[Row] = []
    endpoints: list[str] = []
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            endpoints = re.findall(r"`(POST [^`]+)`", line)
        elif line.startswith("| `"):
            field, handling = (c.strip() for c in line.strip("|").split("|")[:2])
            example = re.search(r"`(.+)`", handling)
            kind = handling.split()[0]
            assert kind in ("supported", "rejected", "ignored"), line
            rows += [
                Row(e, field.strip("`"), kind, example and example.group(1)) for e in endpoints
            ]
    return rows


ROWS = doc_rows()
REJECTED = [r for r in ROWS if r.handling == "rejected"]


def with_field(endpoint: str, path: str, value: Any) -> dict[str, Any]:
    """The endpoint's base body with `path` (dotted; numbers index lists) set to value."""
    body = copy.deepcopy(BASES[endpoint])
    node: Any = body
    *parents, last = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[int(last) if isinstance(node, list) else last] = value
    return body


def request_path(endpoint: str) -> str:
    return endpoint.split(" ", 1)[1]


@pytest.mark.parametrize("endpoint", MODELS)
def test_every_request_field_is_in_the_doc(endpoint):
    model = MODELS[endpoint]
    listed = {r.field for r in ROWS if r.endpoint == endpoint}
    assert listed, f"no table for {endpoint}"
    if model is not None:
        fields = {f.alias or name for name, f in model.model_fields.items()}
        assert fields <= listed, f"not in docs/api-fields.md: {sorted(fields - listed)}"


def test_every_rejected_field_has_an_example_the_test_can_send():
    for row in REJECTED:
        assert row.endpoint in BASES and row.example is not None, row


@pytest.mark.parametrize("row", REJECTED, ids=lambda r: f"{request_path(r.endpoint)}:{r.field}")
def test_rejected_fields_are_400_naming_them(server, row):
    body = with_field(row.endpoint, row.field, json.loads(row.example))
    assert_400(post(server, request_path(row.endpoint), body), row.field)


@pytest.mark.parametrize("endpoint", BASES)
def test_ignored_fields_are_accepted(server, endpoint):
    body = BASES[endpoint]
    for row in ROWS:
        if row.endpoint == endpoint and row.handling == "ignored" and row.example:
            body = {**body, **with_field(endpoint, row.field, json.loads(row.example))}
    r = post(server, request_path(endpoint), body)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "endpoint,changes",
    [
        ("POST /v1/chat/completions",
         {"modalities": ["text"], "reasoning_effort": "none", "verbosity": "medium",
          "length_penalty": 1.0, "functions": [], "audio": None, "use_beam_search": False,
          "web_search_options": {}, "add_special_tokens": False}),
        ("POST /v1/completions", {"add_special_tokens": True, "length_penalty": 1}),
        ("POST /v1/responses",
         {"reasoning": {"effort": None, "summary": None}, "include": [], "top_logprobs": 0,
          "conversation": None, "text": {"verbosity": "medium"}}),
    ],
)  # fmt: skip
def test_values_that_ask_for_nothing_pass(endpoint, changes):
    model = MODELS[endpoint]
    assert model is not None
    model.model_validate({**BASES[endpoint], **changes})
