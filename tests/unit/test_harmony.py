"""GPT-OSS's harmony completions split into reasoning, content and tool calls, the same
whole and in every chunking."""

from __future__ import annotations

import json

import pytest

from tokenmill.structured.harmony import HarmonyParser, ReasoningText, parse_harmony
from tokenmill.structured.tools import ContentDelta, ToolCallArgumentsDelta, ToolCallStart

ANSWER = (
    "<|channel|>analysis<|message|>User greets. Reply.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
CALL_RECIPIENT_FIRST = (
    '<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"q": 1}<|call|>'
)


def test_whole():
    r = parse_harmony(ANSWER)
    assert (r.reasoning, r.content, r.tool_calls) == (
        "User greets. Reply.",
        "Hello! How can I help?",
        [],
    )
    r = parse_harmony(CALL)
    assert r.reasoning == "Need weather." and r.content == ""
    assert [(c.name, json.loads(c.arguments), c.valid) for c in r.tool_calls] == [
        ("get_weather", {"city": "Paris"}, True)
    ]
    r = parse_harmony(CALL_RECIPIENT_FIRST)
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("lookup", '{"q": 1}')]
    assert parse_harmony("no harmony here").content == "no harmony here"
    cut = parse_harmony('<|channel|>commentary to=functions.f json<|message|>{"a": ')
    assert not cut.tool_calls[0].valid  # cut off: never returned as a call


@pytest.mark.parametrize("text", [ANSWER, CALL, CALL_RECIPIENT_FIRST])
@pytest.mark.parametrize("size", [1, 2, 5, 13])
def test_streamed_in_any_chunking(text, size):
    parser = HarmonyParser()
    events = []
    for i in range(0, len(text), size):
        events += parser.feed(text[i : i + size])
    events += parser.finish()
    whole = parse_harmony(text)
    assert "".join(e.text for e in events if isinstance(e, ReasoningText)) == (
        whole.reasoning or ""
    )
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == whole.content
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == [
        c.name for c in whole.tool_calls
    ]
    args = "".join(e.text for e in events if isinstance(e, ToolCallArgumentsDelta))
    assert args == "".join(c.arguments for c in whole.tool_calls)
