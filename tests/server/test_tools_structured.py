"""Tools and structured outputs end to end with the official `openai` client."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.server.conftest import MODEL

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def check_calls(calls, allowed: set[str]) -> list[tuple[str, dict]]:
    assert calls, "no tool call"
    out = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in allowed
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, SCHEMAS[call.function.name])
        out.append((call.function.name, args))
    return out


def stream_calls(client, **kwargs) -> tuple[list[tuple[str, dict]], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        for tc in choice.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"name": None, "args": "", "id": None})
            if tc.id:
                assert slot["id"] is None, "only the first delta of a call carries its id"
                slot["id"], slot["name"] = tc.id, tc.function.name
                assert tc.type == "function"
            else:
                assert tc.function.name is None
            slot["args"] += tc.function.arguments or ""
    return [(c["name"], json.loads(c["args"])) for _, c in sorted(calls.items())], finish


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_required_tool_choice_always_parses(client, temperature):
    kwargs = dict(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=temperature,
        seed=5,
        max_tokens=200,
    )
    r = client.chat.completions.create(**kwargs)
    assert r.choices[0].finish_reason == "tool_calls"
    calls = check_calls(r.choices[0].message.tool_calls, {"get_weather", "add"})
    streamed, finish = stream_calls(client, **kwargs)
    assert streamed == calls and finish == "tool_calls"


def test_named_tool_choice_and_single_call(client):
    kwargs = dict(
        model=MODEL, messages=ASK, tools=TOOLS, temperature=0.7, seed=9, max_tokens=200, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )  # fmt: skip
    r = client.chat.completions.create(**kwargs)
    calls = check_calls(r.choices[0].message.tool_calls, {"add"})
    assert len(calls) == 1
    streamed, _ = stream_calls(client, **kwargs)
    assert streamed == calls


def test_a_call_cut_by_max_tokens_is_returned_as_far_as_it_got(client):
    """A forced call the token limit cuts: the call, its name and the arguments so far, with
    finish_reason "length", the same whole and streamed (not an empty tool_calls)."""
    kwargs = dict(
        model=MODEL, messages=ASK, tools=TOOLS, temperature=0.0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    whole = client.chat.completions.create(max_tokens=200, **kwargs)
    assert whole.choices[0].finish_reason == "tool_calls"
    cut = client.chat.completions.create(max_tokens=whole.usage.completion_tokens - 3, **kwargs)
    choice = cut.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    args = call.function.arguments
    assert args.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(args)
    streamed = ""
    for chunk in client.chat.completions.create(
        stream=True, max_tokens=whole.usage.completion_tokens - 3, **kwargs
    ):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            streamed += tc.function.arguments or ""
    assert streamed == args


def test_tool_results_round_trip(client):
    first = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=200,
    )
    call = first.choices[0].message.tool_calls[0]
    follow = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"temperature": 21, "unit": "celsius"}),
        },
    ]
    r = client.chat.completions.create(
        model=MODEL, messages=follow, tools=TOOLS, temperature=0, max_tokens=40
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_response_format_json_schema(client):
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    for temperature in (0.0, 0.8):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Describe a person as JSON."}], temperature=temperature,
            max_tokens=120, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}},
        )  # fmt: skip
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Any JSON object."}], max_tokens=80,
        response_format={"type": "json_object"}, temperature=0,
    )  # fmt: skip
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_extension_constraints(server):
    base = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Pick one"}],
        "max_tokens": 10,
        "temperature": 1.0,
    }
    r = httpx.post(
        f"{server.v1}/chat/completions",
        json={**base, "structured_outputs": {"choice": ["red", "blue"]}},
        timeout=60,
    )
    assert r.json()["choices"][0]["message"]["content"] in ("red", "blue")
    r = httpx.post(
        f"{server.v1}/completions",
        json={"model": MODEL, "prompt": "Year:", "max_tokens": 8, "guided_regex": " (19|20)\\d\\d"},
        timeout=60,
    )
    assert r.json()["choices"][0]["text"].strip().isdigit()


@pytest.mark.parametrize(
    "changes,param",
    [
        (
            {"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"not": {}}},
                }
            },
            "response_format",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
            "tools.0.function.name",
        ),
    ],
)
def test_inconsistent_requests_get_400(server, changes, param):
    body = {"model": MODEL, "messages": ASK, "max_tokens": 5, **changes}
    r = httpx.post(f"{server.v1}/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}


@pytest.mark.parametrize(
    "text,content,calls",
    [
        ('\n<tool_call>\n{"name": "now"}\n</tool_call>\n', None, [("now", {})]),
        (
            '<tool_call>{"name": "now", "arguments": {}} extra</tool_call>',
            " extra</tool_call>",
            [("now", {})],
        ),  # fmt: skip
        (
            'Sure.\n<tool_call>{"name": "now", "name": "add", "arguments": {}}</tool_call>',
            "Sure.\n",
            [("now", {})],
        ),  # fmt: skip
        ("  \n", "  \n", []),  # no call: whitespace is the content
    ],
    ids=["no-arguments", "text-after-object", "repeated-name", "whitespace-only"],
)
def test_streamed_and_whole_tool_responses_agree(client, text, content, calls):
    """The model's text is forced with a grammar; the non-streamed message and the stream a
    client reassembles carry the same content and the same calls."""
    kwargs = dict(
        model=MODEL, messages=ASK, tools=[NOW, ADD], max_tokens=60, temperature=0,
        extra_body={"structured_outputs": {"grammar": f"start: {json.dumps(text)}"}},
    )  # fmt: skip
    r = client.chat.completions.create(**kwargs)
    message = r.choices[0].message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    assert (message.content, got) == (content, calls)
    assert r.choices[0].finish_reason == ("tool_calls" if calls else "stop")
    streamed_text, streamed_calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        streamed_text += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            slot = streamed_calls.setdefault(tc.index, ["", ""])
            slot[0] += tc.function.name or ""
            slot[1] += tc.function.arguments or ""
    assert (streamed_text or None) == content
    assert [(n, json.loads(a)) for n, a in streamed_calls.values()] == calls
    assert finish == r.choices[0].finish_reason
