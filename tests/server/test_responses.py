"""/v1/responses end to end: the official `openai` client, every object and stream event
parsed strictly into the client's models, tools and round trips, structured output, the
store (ownership, restart), background responses and cancellation, hostile input."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openai import BadRequestError, NotFoundError
from openai.types.responses import Response, ResponseItem, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from tests.compat.common import WEATHER_SCHEMA
from tests.hostile_inputs import nested_schema
from tests.server.conftest import MODEL, start_server
from tokenmill.server.database import Database
from tokenmill.server.responses.config import ResponseStoreConfig
from tokenmill.server.responses.owner import key_owner
from tokenmill.server.responses.protocol import (
    MAX_INPUT_ITEMS,
    MAX_METADATA,
    MAX_TEXT_CHARS,
    MAX_TOOLS,
)
from tokenmill.server.responses.store import ResponseStore

ASK = "What is the weather in Paris, in celsius?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": WEATHER_SCHEMA,
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
EVENTS = TypeAdapter(ResponseStreamEvent)
ITEMS = TypeAdapter(ResponseItem)


# ---------------------------------------------------------------- helpers


def extra_fields(value: Any, path: str = "") -> list[str]:
    """Fields the client's models do not know (they would be kept silently as extras)."""
    found: list[str] = []
    if isinstance(value, BaseModel):
        found += [f"{path}.{k}" for k in value.model_extra or {}]
        for name in type(value).model_fields:
            found += extra_fields(getattr(value, name), f"{path}.{name}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += extra_fields(v, f"{path}[{i}]")
    return found


def strict_response(raw: dict) -> Response:
    response = Response.model_validate(raw)
    assert extra_fields(response) == [], extra_fields(response)
    return response


def create(server, **body) -> httpx.Response:
    return httpx.post(f"{server.v1}/responses", json={"model": MODEL, **body}, timeout=120)


def created(server, **body) -> dict:
    r = create(server, **body)
    assert r.status_code == 200, r.text
    strict_response(r.json())
    return r.json()


def stream_events(server, **body) -> list[dict]:
    """The raw SSE events of a streamed response, each validated into the client's union."""
    events = []
    with httpx.stream(
        "POST", f"{server.v1}/responses", json={"model": MODEL, **body, "stream": True}, timeout=120
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                raw = json.loads(line[len("data: ") :])
                assert raw["type"] == name
                event = EVENTS.validate_python(raw)
                assert extra_fields(event) == [], (raw["type"], extra_fields(event))
                events.append(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def reassemble(events: list[dict]) -> list[dict]:
    """Output items rebuilt from the deltas (and checked against each .done event)."""
    items: dict[int, dict] = {}
    texts: dict[int, str] = {}
    for e in events:
        kind, index = e["type"], e.get("output_index")
        if kind == "response.output_item.added":
            items[index] = e["item"]
        elif kind == "response.output_text.delta":
            texts[index] = texts.get(index, "") + e["delta"]
        elif kind == "response.output_text.done":
            assert e["text"] == texts.get(index, "")
        elif kind == "response.function_call_arguments.delta":
            items[index]["arguments"] += e["delta"]
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == items[index]["arguments"]
        elif kind == "response.output_item.done":
            item = e["item"]
            if item["type"] == "message":
                assert item["content"][0]["text"] == texts.get(index, "")
            else:
                assert item["arguments"] == items[index]["arguments"]
            items[index] = item
    return [items[i] for i in sorted(items)]


def comparable(items: list[dict]) -> list[dict]:
    """Output items without their generated ids."""
    return [{k: v for k, v in it.items() if k not in ("id", "call_id")} for it in items]


def kv_usage(server) -> float:
    return httpx.get(f"{server.base_url}/kv_cache", timeout=30).json()["kv_cache_usage"]


def store_path(server) -> Path:
    """The session server's response store (tests/server/conftest.py names it by port)."""
    port = server.base_url.rsplit(":", 1)[1]
    return Path(server.log_path).parent / f"responses-{port}.sqlite3"


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


# ---------------------------------------------------------------- create


def test_plain_response_parses_strictly(client):
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input="Say hello.",
        instructions="You are terse.",
        max_output_tokens=12,
        temperature=0,
        metadata={"run": "1"},
        user="u-1",
    )
    body = raw.http_response.json()
    strict_response(body)
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] in ("completed", "incomplete")
    if body["status"] == "incomplete":
        assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["metadata"] == {"run": "1"} and body["instructions"] == "You are terse."
    usage = body["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert 0 < usage["output_tokens"] <= 12
    assert usage["input_tokens_details"]["cached_tokens"] >= 0
    [message] = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["annotations"] == []
    # `output_text` is the client's convenience property over the output items
    assert raw.parse().output_text == message["content"][0]["text"] != ""


@pytest.mark.parametrize("tools", [False, True], ids=["text", "tool-call"])
def test_stream_reassembles_to_the_response(server, tools):
    body: dict[str, Any] = {"input": ASK, "max_output_tokens": 16, "temperature": 0}
    if tools:
        body |= {"tools": [WEATHER], "tool_choice": "required", "max_output_tokens": 60}
    whole = created(server, **body)
    events = stream_events(server, **body)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == f"response.{whole['status']}"
    delta = "response.function_call_arguments.delta" if tools else "response.output_text.delta"
    assert delta in kinds
    final = events[-1]["response"]
    assert comparable(reassemble(events)) == comparable(final["output"])
    assert comparable(final["output"]) == comparable(whole["output"])
    assert final["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    if tools:
        [call] = whole["output"]
        assert call["type"] == "function_call" and call["status"] == "completed"
        jsonschema.validate(json.loads(call["arguments"]), WEATHER_SCHEMA)


def test_sdk_stream_helper_accumulates(client):
    """The client's stream helper rebuilds the response from the events (it needs
    response.completed: a one-word enum finishes within a few tokens)."""
    fmt = {"type": "json_schema", "name": "answer", "schema": {"enum": ["yes", "no"]}}
    with client.responses.stream(
        model=MODEL, input="Is Paris in France?", text={"format": fmt}, temperature=0,
        max_output_tokens=8,
    ) as stream:  # fmt: skip
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and json.loads(final.output_text) in ("yes", "no")
    assert "".join(deltas) == final.output_text


def test_tool_round_trip_with_previous_response_id(server, client):
    first = client.responses.create(
        model=MODEL, input=ASK, tools=[WEATHER], tool_choice="required", temperature=0,
        max_output_tokens=60,
    )  # fmt: skip
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    second = client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=20,
    )
    strict_response(httpx.get(f"{server.v1}/responses/{second.id}", timeout=30).json())
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    # the whole conversation was the prompt (the first turn's prompt is cached)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    page = httpx.get(f"{server.v1}/responses/{second.id}/input_items?order=asc", timeout=30)
    items = [ITEMS.validate_python(item) for item in page.json()["data"]]
    assert [extra_fields(i) for i in items] == [[], [], []]
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1].call_id == call.call_id
    listed = client.responses.input_items.list(second.id)  # newest first by default
    assert [i.id for i in listed.data] == [i.id for i in reversed(items)]


def test_json_schema_and_json_object_formats(client):
    fmt = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = client.responses.create(
        model=MODEL, input="Make up a person.", text={"format": fmt}, temperature=0,
        max_output_tokens=60,
    )  # fmt: skip
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), PERSON)
    assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    r = client.responses.create(
        model=MODEL, input="A JSON object please.", text={"format": {"type": "json_object"}},
        temperature=0, max_output_tokens=6,
    )  # fmt: skip
    assert r.output_text.lstrip().startswith("{")  # constrained (the 6 tokens may cut it)


def test_truncation_auto_drops_the_oldest_items(server):
    filler = "lorem ipsum " * 200  # ~1000 tokens a message
    conversation = [
        {"role": "user", "content": "first " + filler},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second " + filler},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "Say hi."},
    ]
    # room for 7000 tokens asked (a stop string ends the answer early): ~1100 fit before
    body = {"input": conversation, "max_output_tokens": 7000, "temperature": 0, "stop": ["."]}
    err = assert_error(create(server, **body), 400, "max_output_tokens")
    assert err["code"] == "context_length_exceeded"
    raw = created(server, **body, truncation="auto")
    assert raw["truncation"] == "auto" and raw["usage"]["input_tokens"] <= 8192 - 7000
    items = httpx.get(f"{server.v1}/responses/{raw['id']}/input_items?order=asc").json()["data"]
    assert items[0]["content"][0]["text"].startswith("second")


# ---------------------------------------------------------------- store


def test_retrieve_and_delete(server, client):
    raw = created(server, input="hi", max_output_tokens=4, metadata={"k": "v"})
    got = httpx.get(f"{server.v1}/responses/{raw['id']}", timeout=30)
    assert got.status_code == 200 and got.json() == raw
    assert client.responses.retrieve(raw["id"]).id == raw["id"]
    deleted = httpx.delete(f"{server.v1}/responses/{raw['id']}", timeout=30)
    assert deleted.json() == {"id": raw["id"], "object": "response.deleted", "deleted": True}
    with pytest.raises(NotFoundError):
        client.responses.retrieve(raw["id"])
    assert_error(httpx.delete(f"{server.v1}/responses/{raw['id']}"), 404)
    unstored = created(server, input="hi", max_output_tokens=2, store=False)
    assert_error(httpx.get(f"{server.v1}/responses/{unstored['id']}"), 404)


def test_another_owners_response_is_not_found(server):
    """A response stored under another API key's owner hash is a 404 for every use."""
    store = ResponseStore(Database(store_path(server)), ResponseStoreConfig())
    theirs = created(server, input="hi", max_output_tokens=2, store=False)
    theirs["id"] = "resp_" + "f" * 32
    store.put(key_owner("someone-else"), theirs, [])
    rid = theirs["id"]
    assert_error(httpx.get(f"{server.v1}/responses/{rid}"), 404)
    assert_error(httpx.delete(f"{server.v1}/responses/{rid}"), 404)
    assert_error(httpx.post(f"{server.v1}/responses/{rid}/cancel"), 404)
    assert_error(httpx.get(f"{server.v1}/responses/{rid}/input_items"), 404)
    r = create(server, input="go on", previous_response_id=rid, max_output_tokens=2)
    assert_error(r, 404, "previous_response_id")
    assert store.get(rid, key_owner("someone-else")) is not None  # not deleted
    store.db.close()


def test_store_bounds_and_reopen(tmp_path):
    path = tmp_path / "r.sqlite3"
    config = ResponseStoreConfig(path=str(path), ttl_s=100, max_rows=3, max_bytes=10_000)
    store = ResponseStore(Database(path), config)

    def put(n: int, created_at: float, pad: int = 0) -> str:
        rid = f"resp_{n:04d}"
        body = {"id": rid, "created_at": created_at, "status": "completed", "pad": "x" * pad}
        store.put("me", body, [{"id": f"msg_{n}"}])
        return rid

    now = time.time()
    old = put(0, now - 101)  # expired: never returned, evicted on the next write
    assert store.get(old, "me") is None
    ids = [put(n, now - 10 + n) for n in range(1, 5)]
    assert store.count()[0] == 3 and store.get(ids[0], "me") is None  # row cap: oldest out
    assert store.get(ids[-1], "me").context == [{"id": "msg_4"}]
    assert store.get(ids[-1], "other") is None
    put(9, now, pad=9_700)  # byte cap: the oldest go until it fits
    assert store.count()[1] <= 10_000
    assert store.get(ids[1], "me") is None and store.get("resp_0009", "me") is not None
    assert not store.delete("resp_0009", "other") and store.delete("resp_0009", "me")
    store.put("me", {"id": "resp_keep", "created_at": now, "status": "completed"}, [])
    store.db.close()
    reopened = ResponseStore(Database(path), config)
    assert reopened.get("resp_keep", "me").response["status"] == "completed"
    reopened.db.close()


@pytest.mark.slow
def test_responses_survive_a_restart_and_stay_with_their_key(tmp_path):
    """~50 s: two server starts on one store file, with an API key; a background response
    still running at shutdown ends as failed."""
    path = str(tmp_path / "store.sqlite3")
    flags = ("--response-store", path, "--api-key", "key-a", "--drain-timeout", "1")
    headers = {"Authorization": "Bearer key-a"}
    srv = start_server(tmp_path, *flags)
    try:
        r = httpx.post(
            f"{srv.v1}/responses", json={"input": "hi", "max_output_tokens": 4}, headers=headers
        )
        assert r.status_code == 200, r.text
        before = r.json()
        long = {"input": "Talk.", "max_output_tokens": 4000, "ignore_eos": True, "background": True}
        running = httpx.post(f"{srv.v1}/responses", json=long, headers=headers).json()
    finally:
        assert srv.stop() == 0
    other = ResponseStore(Database(path), ResponseStoreConfig(path=path))
    other.put(key_owner("key-b"), {**before, "id": "resp_" + "b" * 32}, [])
    other.db.close()
    srv = start_server(tmp_path, *flags)
    try:
        got = httpx.get(f"{srv.v1}/responses/{before['id']}", headers=headers)
        assert got.status_code == 200 and got.json() == before
        assert_error(httpx.get(f"{srv.v1}/responses/resp_{'b' * 32}", headers=headers), 404)
        body = {"input": "more", "previous_response_id": "resp_" + "b" * 32}
        r = httpx.post(f"{srv.v1}/responses", json=body, headers=headers)
        assert_error(r, 404, "previous_response_id")
        assert httpx.get(f"{srv.v1}/responses/{before['id']}").status_code == 401
        got = httpx.get(f"{srv.v1}/responses/{running['id']}", headers=headers).json()
        assert got["status"] == "failed" and got["error"]["code"] == "server_error"
        strict_response(got)
    finally:
        assert srv.stop() == 0


# ---------------------------------------------------------------- background


def poll(client, rid: str, until: set[str], timeout: float = 120) -> Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.responses.retrieve(rid)
        if r.status in until:
            return r
        time.sleep(0.1)
    raise AssertionError(f"{rid} still {r.status}")


def test_background_response_polls_to_completed(server, client):
    r = client.responses.create(
        model=MODEL, input="Say hi.", background=True, max_output_tokens=8, temperature=0
    )
    assert r.status in ("queued", "in_progress") and r.background is True
    done = poll(client, r.id, {"completed", "incomplete"})
    assert done.output_text and done.usage.output_tokens > 0
    strict_response(httpx.get(f"{server.v1}/responses/{r.id}", timeout=30).json())
    assert client.responses.cancel(r.id).status == done.status  # idempotent once finished


def test_cancel_stops_the_generation_and_frees_its_kv(server, client):
    r = client.responses.create(
        model=MODEL, input="Tell me a long story.", background=True, max_output_tokens=4000,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    poll(client, r.id, {"in_progress"})
    deadline = time.monotonic() + 60
    while kv_usage(server) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kv_usage(server) > 0
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled"
    strict_response(httpx.post(f"{server.v1}/responses/{r.id}/cancel", timeout=30).json())
    deadline = time.monotonic() + 10
    while kv_usage(server) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kv_usage(server) == 0
    assert client.responses.retrieve(r.id).status == "cancelled"
    plain = client.responses.create(model=MODEL, input="hi", max_output_tokens=2)
    with pytest.raises(BadRequestError):
        client.responses.cancel(plain.id)


# ---------------------------------------------------------------- hostile input

BAD = [
    # (id, body changes, status, param)
    ("unknown-item-type", {"input": [{"type": "computer_call", "id": "x"}]}, 400, "input.0"),
    ("item-type-not-a-string", {"input": [{"type": 5}]}, 400, "input.0"),
    ("item-not-an-object", {"input": [5]}, 400, "input.0"),
    ("empty-input", {"input": []}, 400, "input"),
    ("missing-input", {"input": ...}, 400, "input"),
    ("bad-role", {"input": [{"role": "tool", "content": "x"}]}, 400, "input.0.role"),
    (
        "call-without-arguments",
        {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
        400,
        "input.0.arguments",
    ),
    (
        "image-part",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        400,
        "input.0.content.0",
    ),
    (
        "output-for-unknown-call",
        {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]},
        400,
        "input.0.call_id",
    ),
    ("too-many-items", {"input": [{"role": "user", "content": "x"}] * (MAX_INPUT_ITEMS + 1)}, 400, "input"),
    ("text-too-long", {"input": "x" * (MAX_TEXT_CHARS + 1)}, 400, "input"),
    ("instructions-too-long", {"instructions": "x" * (MAX_TEXT_CHARS + 1)}, 400, "instructions"),
    ("context-exceeded", {"input": "hello " * 9000}, 400, "input"),
    ("max-output-tokens-too-big", {"max_output_tokens": 10_000}, 400, "max_output_tokens"),
    ("max-output-tokens-zero", {"max_output_tokens": 0}, 400, "max_output_tokens"),
    ("temperature-too-high", {"temperature": 3}, 400, "temperature"),
    ("metadata-too-many", {"metadata": {str(i): "v" for i in range(MAX_METADATA + 1)}}, 400, "metadata"),
    ("metadata-long-key", {"metadata": {"k" * 65: "v"}}, 400, "metadata"),
    ("metadata-long-value", {"metadata": {"k": "v" * 513}}, 400, "metadata"),
    ("metadata-not-string", {"metadata": {"k": 1}}, 400, "metadata.k"),
    ("hosted-tool", {"tools": [{"type": "web_search"}]}, 400, "tools.0"),
    ("too-many-tools", {"tools": [WEATHER] * (MAX_TOOLS + 1)}, 400, "tools"),
    ("bad-tool-name", {"tools": [{**WEATHER, "name": "a b"}]}, 400, "tools.0.name"),
    ("tool-choice-unknown", {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}}, 400, "tool_choice"),
    ("tool-choice-without-tools", {"tool_choice": "required"}, 400, "tool_choice"),
    ("format-unknown", {"text": {"format": {"type": "xml"}}}, 400, "text.format"),
    ("schema-missing", {"text": {"format": {"type": "json_schema", "name": "x"}}}, 400, "text.format.schema"),
    (
        "schema-too-deep",
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": nested_schema(40)}}},
        400,
        "text.format",
    ),
    ("previous-id-malformed", {"previous_response_id": "abc"}, 400, "previous_response_id"),
    ("previous-id-unknown", {"previous_response_id": "resp_" + "0" * 32}, 404, "previous_response_id"),
    ("background-without-store", {"background": True, "store": False}, 400, "background"),
    ("background-stream", {"background": True, "stream": True}, 400, "stream"),
    ("truncation-unknown", {"truncation": "sometimes"}, 400, "truncation"),
    ("unknown-model", {"model": "gpt-9"}, 404, "model"),
]  # fmt: skip


@pytest.mark.parametrize("changes,status,param", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_requests_get_the_error_envelope(server, changes, status, param):
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 4, **changes}
    body = {k: v for k, v in body.items() if v is not ...}
    r = httpx.post(f"{server.v1}/responses", json=body, timeout=60)
    assert_error(r, status, param)


@pytest.mark.parametrize(
    "method,path,status",
    [
        ("GET", "/v1/responses/resp_" + "0" * 32, 404),
        ("DELETE", "/v1/responses/resp_" + "0" * 32, 404),
        ("POST", "/v1/responses/resp_" + "0" * 32 + "/cancel", 404),
        ("GET", "/v1/responses/not-an-id", 400),
        ("GET", "/v1/responses/resp_" + "a" * 5000, 400),
        ("GET", "/v1/responses/resp_" + "0" * 32 + "/input_items?limit=1000", 400),
        ("PUT", "/v1/responses", 405),
    ],
)
def test_bad_paths_get_the_error_envelope(server, method, path, status):
    assert_error(httpx.request(method, f"{server.base_url}{path}", timeout=30), status)


def test_server_healthy_after_bad_responses_requests(server, client):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert client.responses.create(model=MODEL, input="hi", max_output_tokens=2).output_text


def test_openapi_documents_the_request_body(server):
    doc = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
    body = doc["paths"]["/v1/responses"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ResponsesRequest")
    assert "input" in doc["components"]["schemas"]["ResponsesRequest"]["properties"]
