"""Guardrails and tool policy through the gateway middleware, streamed and not, read with the
official openai client (fake upstream with scripted output, so every byte is known)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI, BadRequestError

from tests.gateway.harness import make_harness

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
RULES = {
    "guardrails": {
        "rules": [
            {"name": "secrets", "scanner": "secrets", "action": "block"},
            {"name": "emails", "scanner": "pii", "entities": ["email"], "action": "redact"},
            {
                "name": "competitor",
                "scanner": "deny_list",
                "terms": ["acme corp"],
                "action": "fallback",
                "fallback": "I can't discuss that.",
            },
            {
                "name": "project",
                "scanner": "regex",
                "pattern": "(?i)project\\s+x",
                "action": "audit",
            },
        ]
    },
    "tool_policies": {
        "strict": {
            "allow": ["get_weather", "fetch"],
            "allowed_hosts": ["api.weather.example"],
            "deny_patterns": ["rm -rf"],
            "refusal": "Tool call refused by policy.",
        }
    },
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}}},
    {"type": "function", "function": {"name": "fetch", "parameters": {
        "type": "object", "properties": {"url": {"type": "string"}}, "required": ["url"]}}},
    {"type": "function", "function": {"name": "delete_all", "parameters": {"type": "object"}}},
]  # fmt: skip


@pytest.fixture
def harness(tmp_path):
    h = make_harness(tmp_path, RULES)
    yield h
    h.close()


def client(harness, key: str) -> AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=harness.app), base_url="http://gw")
    return AsyncOpenAI(base_url="http://gw/v1", api_key=key, http_client=http, max_retries=0)


async def chat(c: AsyncOpenAI, pieces: list[str], stream: bool, **kw):
    """The content (and the response or the chunks) of a scripted completion."""
    extra = {"x_script": {"pieces": pieces, "tool_calls": kw.pop("calls", [])}}
    args = dict(model="m", messages=[{"role": "user", "content": kw.pop("prompt", "hi")}],
                extra_body=extra, **kw)  # fmt: skip
    if not stream:
        reply = await c.chat.completions.create(**args)
        return reply.choices[0].message.content, reply
    chunks = [ch async for ch in await c.chat.completions.create(stream=True, **args)]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return text, chunks


def events_of(harness, rule: str) -> list[tuple]:
    harness.gateway.ledger.flush(10)
    return harness.gateway.db.fetchall(
        "SELECT stage, action, matched_text FROM guardrail_events WHERE rule = ?", (rule,)
    )


@pytest.mark.parametrize("stream", [False, True])
def test_audit_passes_every_byte_and_records_the_match(harness, stream):
    async def main():
        key, _ = await harness.new_key()
        pieces = ["The Pro", "ject ", 'X plan is {"a": [1]} ', "ready."]
        text, _ = await chat(client(harness, key), pieces, stream)
        assert text == "".join(pieces)
        assert events_of(harness, "project") == [("output", "audit", "project: P…X (9 chars)")]

    asyncio.run(main())


@pytest.mark.parametrize("stream", [False, True])
def test_redact_masks_output_split_across_chunks(harness, stream):
    async def main():
        key, _ = await harness.new_key()
        pieces = ["Write to ja", "ne.doe@exa", "mple.com today."]
        text, _ = await chat(client(harness, key), pieces, stream)
        assert "jane.doe@example.com" not in text and "example.com" not in text
        assert text.startswith("Write to ") and text.endswith(" today.")
        assert events_of(harness, "emails") == [("output", "redact", "email: j…m (20 chars)")]  # never the match

    asyncio.run(main())


def test_block_output_streamed_ends_with_an_error_event_and_leaks_nothing(harness):
    async def main():
        key, _ = await harness.new_key()
        pieces = ["Here is the key: AKIA", "IOSFODNN7", "EXAMPLE and more text after it."]
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=harness.app), base_url="http://gw"
        )
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
                "x_script": {"pieces": pieces}}  # fmt: skip
        reply = await http.post(
            "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
        raw = reply.text
        assert "AKIA" not in raw and "IOSFODNN7" not in raw
        events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        assert events[-1]["error"]["code"] == "guardrail_blocked"
        assert raw.rstrip().endswith("data: [DONE]")
        with pytest.raises(BadRequestError) as err:
            await chat(client(harness, key), pieces, stream=False)
        assert err.value.body["code"] == "guardrail_blocked" and "AKIA" not in str(err.value)

    asyncio.run(main())


@pytest.mark.parametrize("stream", [False, True])
def test_fallback_output_never_leaks_the_blocked_text(harness, stream):
    async def main():
        key, _ = await harness.new_key()
        pieces = ["We like ", "Acme ", "Corp products", " a lot."]
        text, reply = await chat(client(harness, key), pieces, stream)
        assert "Acme" not in text and "a lot" not in text
        assert text.endswith("I can't discuss that.")
        if not stream:
            assert text == "I can't discuss that."
            assert reply.choices[0].finish_reason == "content_filter"

    asyncio.run(main())


def test_input_actions(harness):
    async def main():
        key, _ = await harness.new_key()
        c = client(harness, key)
        with pytest.raises(BadRequestError) as err:
            await chat(c, ["ok"], False, prompt=f"my key is {AWS_KEY}")
        assert err.value.body["code"] == "guardrail_blocked" and AWS_KEY not in str(err.value.body)
        assert harness.seen.bodies == []  # never reached the model
        for stream in (False, True):
            text, _ = await chat(c, ["ok"], stream, prompt="tell me about ACME Corp")
            assert text == "I can't discuss that."
        assert harness.seen.bodies == []
        await chat(c, ["ok"], False, prompt="mail bob@example.org please")
        sent = harness.seen.bodies[-1]["messages"][0]["content"]
        assert "bob@example.org" not in sent and sent.startswith("mail ")
        await chat(c, ["ok"], False, prompt="about project X")
        assert harness.seen.bodies[-1]["messages"][0]["content"] == "about project X"

    asyncio.run(main())


CALLS_ALLOWED = [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
CALLS_REFUSED = [
    [{"name": "delete_all", "arguments": "{}"}],  # not on the allowlist
    [{"name": "get_weather", "arguments": '{"town": "Paris"}'}],  # schema violation
    [{"name": "get_weather", "arguments": "{not json"}],
    [{"name": "fetch", "arguments": '{"url": "https://evil.example/x"}'}],  # host
    [{"name": "fetch", "arguments": '{"url": "https://api.weather.example/rm -rf"}'}],  # pattern
    [{"name": "undeclared", "arguments": "{}"}],
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("n", [1, 2])
def test_tool_policy_refuses_calls_outside_it_streamed_and_with_n(harness, stream, n):
    async def main():
        key, key_id = await harness.new_key(tool_policy="strict")
        c = client(harness, key)
        for calls in CALLS_REFUSED:
            args = dict(model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS, n=n,
                        extra_body={"x_script": {"pieces": [], "tool_calls": calls}})  # fmt: skip
            if stream:
                chunks = [ch async for ch in await c.chat.completions.create(stream=True, **args)]
                for index in range(n):
                    mine = [
                        ch.choices[0]
                        for ch in chunks
                        if ch.choices and ch.choices[0].index == index
                    ]
                    assert not any(ch.delta.tool_calls for ch in mine), calls
                    assert (
                        "".join(ch.delta.content or "" for ch in mine)
                        == "Tool call refused by policy."
                    )
                    assert mine[-1].finish_reason == "stop"
            else:
                reply = await c.chat.completions.create(**args)
                assert len(reply.choices) == n
                for choice in reply.choices:
                    assert not choice.message.tool_calls, calls
                    assert choice.message.content == "Tool call refused by policy."
                    assert choice.finish_reason == "stop"
        args = dict(model="m", messages=[{"role": "user", "content": "go"}], tools=TOOLS, n=n,
                    extra_body={"x_script": {"pieces": [], "tool_calls": CALLS_ALLOWED}})  # fmt: skip
        if stream:
            chunks = [ch async for ch in await c.chat.completions.create(stream=True, **args)]
            got = [
                tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])
            ]
            assert len(got) == n and all(
                json.loads(tc.function.arguments) == {"city": "Paris"} for tc in got
            )
        else:
            reply = await c.chat.completions.create(**args)
            assert all(
                ch.message.tool_calls[0].function.name == "get_weather" for ch in reply.choices
            )
        harness.gateway.ledger.flush(10)
        audited = harness.gateway.db.fetchall(
            "SELECT tool_name, allowed FROM tool_call_events WHERE key_id = ?", (key_id,)
        )
        assert len(audited) == n * (len(CALLS_REFUSED) + 1)
        assert sum(1 for _, allowed in audited if allowed) == n

    asyncio.run(main())


def test_model_based_classifier_asks_the_inner_app(tmp_path):
    judge_rule = {"name": "no-cats", "scanner": "classifier", "positive": "yes", "threshold": 0.5,
                  "prompt": "Is this about cats? Answer yes or no.\n\n{text}", "action": "block"}  # fmt: skip
    h = make_harness(tmp_path, {"guardrails": {"rules": [judge_rule]}})

    async def main():
        key, _ = await h.new_key()
        c = client(h, key)
        text, _ = await chat(c, ["Dogs are great."], False, prompt="tell me about dogs")
        assert text == "Dogs are great."
        with pytest.raises(BadRequestError) as err:
            await chat(c, ["ok"], False, prompt="tell me about cats")
        assert err.value.body["code"] == "guardrail_blocked"
        # output: decided once the whole text is known (streamed: at its end)
        with pytest.raises(BadRequestError):
            await chat(c, ["I love cats."], False, prompt="pets?")
        questions = [
            b["messages"][-1]["content"] for b in h.seen.bodies if b.get("max_tokens") == 1
        ]
        assert questions[0] == "Is this about cats? Answer yes or no.\n\ntell me about dogs"
        assert any(q.endswith("I love cats.") for q in questions)

    asyncio.run(main())
    h.close()


def test_audit_only_output_rules_hold_nothing_back(tmp_path):
    audit = {
        "name": "project",
        "scanner": "regex",
        "pattern": "(?i)project\\s+x",
        "action": "audit",
    }
    h = make_harness(tmp_path, {"guardrails": {"rules": [audit]}})

    async def main():
        key, _ = await h.new_key()
        pieces = ["Pro", "ject", " X", " is", " on."]
        _, chunks = await chat(client(h, key), pieces, stream=True)
        contents = [
            ch.choices[0].delta.content
            for ch in chunks
            if ch.choices and ch.choices[0].delta.content
        ]
        assert contents == pieces  # each piece sent as it came
        assert events_of(h, "project") == [("output", "audit", "project: P…X (9 chars)")]

    asyncio.run(main())
    h.close()
