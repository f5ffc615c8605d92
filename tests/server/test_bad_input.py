"""Every client mistake gets the right 4xx with the OpenAI error envelope; the server stays healthy."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL

OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
OK_COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 4}


CYCLIC_SCHEMA = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                 "$ref": "#/$defs/a"}  # fmt: skip


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def chat(**changes):
    body = {**OK_CHAT, **changes}
    return {k: v for k, v in body.items() if v is not ...}


CASES = [
    # (id, method, path, body (dict -> JSON, bytes -> raw), headers, status, param)
    ("bad-json", "POST", "/v1/chat/completions", b'{"model": "x", "messages": [', None, 400, None),
    ("not-an-object", "POST", "/v1/chat/completions", b"[1, 2, 3]", None, 400, None),
    ("empty-body", "POST", "/v1/chat/completions", b"", None, 400, None),
    (
        "wrong-content-type",
        "POST",
        "/v1/chat/completions",
        b"model=x",
        {"content-type": "application/x-www-form-urlencoded"},
        415,
        None,
    ),
    ("missing-messages", "POST", "/v1/chat/completions", chat(messages=...), None, 400, "messages"),
    ("missing-model", "POST", "/v1/chat/completions", chat(model=...), None, 400, "model"),
    ("empty-messages", "POST", "/v1/chat/completions", chat(messages=[]), None, 400, "messages"),
    (
        "messages-not-list",
        "POST",
        "/v1/chat/completions",
        chat(messages="hi"),
        None,
        400,
        "messages",
    ),
    (
        "bad-role",
        "POST",
        "/v1/chat/completions",
        chat(messages=[{"role": "wizard", "content": "x"}]),
        None,
        400,
        "messages.0.role",
    ),
    (
        "content-wrong-type",
        "POST",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": 5}]),
        None,
        400,
        "messages.0.content",
    ),
    (
        "image-part",
        "POST",
        "/v1/chat/completions",
        chat(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        ),
        None,
        400,
        "messages.0.content.0.type",  # the part's type, not "should be a valid string"
    ),
    (
        "temperature-string",
        "POST",
        "/v1/chat/completions",
        chat(temperature="hot"),
        None,
        400,
        "temperature",
    ),
    (
        "temperature-negative",
        "POST",
        "/v1/chat/completions",
        chat(temperature=-1),
        None,
        400,
        "temperature",
    ),
    (
        "temperature-too-high",
        "POST",
        "/v1/chat/completions",
        chat(temperature=3),
        None,
        400,
        "temperature",
    ),
    ("top-p-zero", "POST", "/v1/chat/completions", chat(top_p=0), None, 400, "top_p"),
    ("top-p-above-one", "POST", "/v1/chat/completions", chat(top_p=1.5), None, 400, "top_p"),
    (
        "max-tokens-zero",
        "POST",
        "/v1/chat/completions",
        chat(max_tokens=0),
        None,
        400,
        "max_tokens",
    ),
    (
        "max-tokens-float",
        "POST",
        "/v1/chat/completions",
        chat(max_tokens=1.5),
        None,
        400,
        "max_tokens",
    ),
    (
        "max-tokens-string",
        "POST",
        "/v1/chat/completions",
        chat(max_tokens="ten"),
        None,
        400,
        "max_tokens",
    ),
    ("n-zero", "POST", "/v1/chat/completions", chat(n=0), None, 400, "n"),
    ("n-too-many", "POST", "/v1/chat/completions", chat(n=1000), None, 400, "n"),
    ("stream-not-bool", "POST", "/v1/chat/completions", chat(stream="yes"), None, 400, "stream"),
    ("stop-number", "POST", "/v1/chat/completions", chat(stop=5), None, 400, "stop"),
    ("stop-list-mixed", "POST", "/v1/chat/completions", chat(stop=["a", 1]), None, 400, "stop.1"),
    (
        "top-logprobs-too-many",
        "POST",
        "/v1/chat/completions",
        chat(logprobs=True, top_logprobs=50),
        None,
        400,
        "top_logprobs",
    ),
    (
        "top-logprobs-without-logprobs",
        "POST",
        "/v1/chat/completions",
        chat(top_logprobs=2),
        None,
        400,
        "top_logprobs",
    ),
    (
        "presence-penalty-range",
        "POST",
        "/v1/chat/completions",
        chat(presence_penalty=5),
        None,
        400,
        "presence_penalty",
    ),
    (
        "logit-bias-bad-key",
        "POST",
        "/v1/chat/completions",
        chat(logit_bias={"abc": 1}),
        None,
        400,
        "logit_bias",
    ),
    (
        "logit-bias-out-of-vocab",
        "POST",
        "/v1/chat/completions",
        chat(logit_bias={"999999": 1}),
        None,
        400,
        "logit_bias",
    ),
    (
        "stop-token-out-of-vocab",
        "POST",
        "/v1/chat/completions",
        chat(stop_token_ids=[10**7]),
        None,
        400,
        "stop_token_ids",
    ),
    ("seed-string", "POST", "/v1/chat/completions", chat(seed="x"), None, 400, "seed"),
    ("unknown-model", "POST", "/v1/chat/completions", chat(model="gpt-9"), None, 404, "model"),
    (
        "oversize-prompt",
        "POST",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "hello " * 9000}], max_tokens=...),
        None,
        400,
        None,
    ),
    (
        "prompt-plus-max-tokens",
        "POST",
        "/v1/chat/completions",
        chat(max_tokens=8190),
        None,
        400,
        "max_tokens",
    ),
    ("completion-missing-prompt", "POST", "/v1/completions", {"model": MODEL}, None, 400, "prompt"),
    (
        "completion-empty-prompt",
        "POST",
        "/v1/completions",
        {**OK_COMPLETION, "prompt": ""},
        None,
        400,
        "prompt",
    ),
    (
        "completion-prompt-wrong-type",
        "POST",
        "/v1/completions",
        {**OK_COMPLETION, "prompt": {"a": 1}},
        None,
        400,
        "prompt",
    ),
    (
        "completion-token-out-of-vocab",
        "POST",
        "/v1/completions",
        {**OK_COMPLETION, "prompt": [1, 2, 10**8]},
        None,
        400,
        "prompt",
    ),
    (
        "completion-logprobs-too-many",
        "POST",
        "/v1/completions",
        {**OK_COMPLETION, "logprobs": 50},
        None,
        400,
        "logprobs",
    ),
    (
        "completion-suffix",
        "POST",
        "/v1/completions",
        {**OK_COMPLETION, "suffix": "x"},
        None,
        400,
        "suffix",
    ),
    ("wrong-method-get-chat", "GET", "/v1/chat/completions", None, None, 405, None),
    ("wrong-method-post-models", "POST", "/v1/models", OK_CHAT, None, 405, None),
    ("unknown-endpoint", "GET", "/v1/engines", None, None, 404, None),
    ("detokenize-bad-id", "POST", "/detokenize", {"tokens": [-1]}, None, 400, "tokens.0"),
    ("tokenize-nothing", "POST", "/tokenize", {}, None, 400, "prompt"),
    ("responses-bad-json", "POST", "/v1/responses", b'{"input": [', None, 400, None),
    ("responses-missing-input", "POST", "/v1/responses", {"model": MODEL}, None, 400, "input"),
    (
        "responses-unknown-item",
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": [{"type": "web_search_call", "id": "x"}]},
        None,
        400,
        "input.0",
    ),
    (
        "responses-wrong-content-type",
        "POST",
        "/v1/responses",
        b"input=hi",
        {"content-type": "text/plain"},
        415,
        None,
    ),
    ("responses-unknown-id", "GET", "/v1/responses/resp_0", None, None, 404, None),
    (
        "tool-parameters-not-object",
        "POST",
        "/v1/chat/completions",
        chat(
            tools=[
                {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
            ]
        ),  # fmt: skip
        None,
        400,
        "tools.0.function.parameters",
    ),
    (
        "tool-message-without-call-id",
        "POST",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}]),
        None,
        400,
        "messages.1",
    ),
    ("stop-too-many", "POST", "/v1/chat/completions", chat(stop=["a"] * 17), None, 400, "stop"),
    # constraints no text satisfies: refused up front, never an HTTP 200 that says "stop"
    *(
        (f"unsatisfiable-{name}-{how}", "POST", path, body, None, 400, None)
        for name, schema in (
            ("ref-cycle", CYCLIC_SCHEMA),
            ("huge-pattern", {"type": "string", "pattern": "^a{1000000}$"}),
        )
        for how, path, body in (
            ("chat", "/v1/chat/completions", chat(response_format=json_schema_format(schema))),
            (
                "chat-stream",
                "/v1/chat/completions",
                chat(stream=True, response_format=json_schema_format(schema)),
            ),
            (
                "responses",
                "/v1/responses",
                {
                    "model": MODEL,
                    "input": "hi",
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
                },  # fmt: skip
            ),
        )
    ),
    *(
        (
            f"unsatisfiable-{name}",
            "POST",
            "/v1/completions",
            {**OK_COMPLETION, **extra},
            None,
            400,
            None,
        )  # fmt: skip
        for name, extra in (
            ("left-recursion", {"structured_outputs": {"grammar": 'start: start "x"'}}),
            ("rule-cycle", {"structured_outputs": {"grammar": "start: a\na: b\nb: a"}}),
            ("empty-class", {"structured_outputs": {"regex": "[^\\x00-\\U0010FFFF]"}}),
            ("huge-repeat", {"structured_outputs": {"regex": "a{1000000}"}}),
        )
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_envelope(server, case):
    _, method, path, body, headers, status, param = case
    kwargs: dict = {"headers": headers or {}}
    if isinstance(body, bytes):
        kwargs["content"] = body
        kwargs["headers"] = {"content-type": "application/json", **(headers or {})}
    elif body is not None:
        kwargs["json"] = body
    r = httpx.request(method, f"{server.base_url}{path}", timeout=60, **kwargs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    assert r.headers.get("x-request-id")


def test_oversize_body_gets_413(server):
    big = b'{"model": "x", "prompt": "' + b"a" * (5 * 1024 * 1024) + b'"}'
    r = httpx.post(
        f"{server.v1}/completions",
        content=big,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413 and r.json()["error"]["message"]


def test_union_field_errors_name_the_real_problem(server):
    """A list of 17 stop strings is "at most 16 items", not "should be a valid string"."""
    r = httpx.post(f"{server.v1}/chat/completions", json=chat(stop=["a"] * 17), timeout=30)
    assert "at most 16" in r.json()["error"]["message"]
    r = httpx.post(f"{server.v1}/chat/completions", json=chat(stop=5), timeout=30)
    assert r.json()["error"]["message"] == (
        "stop: Input should be a valid string or Input should be a valid list"
    )


def test_server_healthy_after_bad_inputs(server, client):
    assert len(CASES) >= 25
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    r = client.chat.completions.create(model=MODEL, messages=OK_CHAT["messages"], max_tokens=4)
    assert r.choices[0].message.content is not None
