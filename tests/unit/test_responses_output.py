"""Responses output items and conversation items without a server: the output builder is
chunking-invariant (a stream reassembles to the non-streamed items), and conversation items
become the chat messages the chat endpoint renders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.server.errors import APIError
from tokenmill.server.responses.conversation import (
    chat_messages,
    context_items,
    cut_points,
    input_items,
)
from tokenmill.server.responses.output import OutputBuilder
from tokenmill.server.responses.protocol import ResponsesRequest

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
TEXTS = [
    "  Hello there\n",
    f"Sure.\n{CALL}\n{CALL}  after ",
    f"{CALL}",
    '<tool_call>{"name": "x", "arguments": {"a": ',  # cut off mid-call
    '<tool_call>{"nme": 1}</tool_call> not a call',
    "",
]


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in it.items() if k not in ("id", "call_id")} for it in items]


def build(text: str, chunks: list[int], tools: bool, parallel: bool = True):
    builder = OutputBuilder(tools, parallel)
    events, start = [], 0
    for size in chunks:
        events += builder.feed(text[start : start + size])
        start += size
    events += builder.feed(text[start:])
    events += builder.finish(incomplete=False)
    return builder.items, events


@settings(max_examples=60, deadline=None)
@given(
    text=st.sampled_from(TEXTS),
    chunks=st.lists(st.integers(1, 7), max_size=40),
    tools=st.booleans(),
)
def test_any_chunking_gives_the_same_items_and_events_rebuild_them(text, chunks, tools):
    whole, _ = build(text, [], tools)
    items, events = build(text, chunks, tools)
    assert without_ids(items) == without_ids(whole)
    done = {
        e["output_index"]: e["item"] for e in events if e["type"] == "response.output_item.done"
    }
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert sorted(done) == added == list(range(len(items)))
    assert [done[i] for i in sorted(done)] == items


def test_tools_split_text_and_calls():
    items, _ = build(f"Sure.\n{CALL}\n{CALL}  after ", [], tools=True)
    assert [i["type"] for i in items] == ["message", "function_call", "function_call"]
    assert items[0]["content"][0]["text"] == "Sure.\n\n  after"
    assert items[1]["arguments"] == '{"city": "Paris", "unit": "c"}'
    assert items[1]["status"] == "completed" and items[1]["call_id"].startswith("call_")
    one, _ = build(f"{CALL}\n{CALL}", [], tools=True, parallel=False)
    assert [i["type"] for i in one] == ["function_call"]
    cut, _ = build(TEXTS[3], [], tools=True)
    assert cut[0]["status"] == "incomplete"
    empty, _ = build("", [], tools=False)
    assert empty[0]["content"][0]["text"] == ""


def test_items_become_chat_messages():
    req = ResponsesRequest.model_validate(
        {
            "input": [
                {"role": "user", "content": "weather?"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "19 C"}]},
            ]
        }
    )  # fmt: skip
    items = context_items([], input_items(req), "disabled")
    messages = chat_messages(items, "Be brief.")
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[2].content == "Let me see." and len(messages[2].tool_calls) == 2
    assert messages[4].content == "19 C" and messages[4].tool_call_id == "c2"
    assert items[1]["content"][0] == {
        "type": "output_text",
        "text": "Let me see.",
        "annotations": [],
    }
    assert cut_points(items) == []


def test_an_output_without_its_call_is_a_400():
    req = ResponsesRequest.model_validate(
        {"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}
    )
    with pytest.raises(APIError) as err:
        context_items([], input_items(req), "disabled")
    assert err.value.param == "input.0.call_id"
