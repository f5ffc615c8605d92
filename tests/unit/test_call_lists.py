"""Tool calls written as one list (vLLM's pythonic and phi4_mini_json parsers): the calls of a
well-formed list, any chunking giving the same result, and bad lists staying content."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenmill.structured.call_lists import (
    HERMES,
    PHI4_MINI_JSON,
    PYTHONIC,
    CallListParser,
    parse_functools,
    parse_pythonic,
    resolve_tool_call_parser,
)
from tokenmill.structured.tools import ContentDelta, ToolCallArgumentsDelta, ToolCallStart

DATA = Path(__file__).parents[1] / "data" / "chat_templates"


def _calls(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_pythonic_calls():
    text = " [get_weather(city=\"Paris\", days=2), get_time(tz='UTC', dst=True, x=None)]\n"
    assert _calls(parse_pythonic(text)) == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_time", {"tz": "UTC", "dst": True, "x": None}),
    ]
    assert _calls(parse_pythonic("[f(a=[1, {'k': 'v'}], b=-1.5)]")) == [
        ("f", {"a": [1, {"k": "v"}], "b": -1.5})
    ]
    assert _calls(parse_pythonic("[ping()]")) == [("ping", {})]


def test_functools_calls():
    text = 'functools[{"name": "get_weather", "arguments": {"city": "Zürich"}}, {"name": "g", "parameters": {}}]'
    assert _calls(parse_functools(text)) == [("get_weather", {"city": "Zürich"}), ("g", {})]


@pytest.mark.parametrize(
    "text",
    [
        "[f(a=1)", "[f(1)]", "[f(**k)]", "[os.system(c='x')]", "[f(a=g())]", "[f(a=x)]",
        "[1, 2]", "[]", "[f(a=1)] trailing", "[f(a=__import__('os'))]", "[" * 5000,
        "[f(a=" + "[" * 1000 + "]" * 1000 + ")]",
    ],
)  # fmt: skip
def test_bad_pythonic_is_no_call(text):
    assert parse_pythonic(text) is None


@pytest.mark.parametrize(
    "text",
    [
        "functools[", "functools[{}]", 'functools[{"name": 1}]', "functools{}", "functools[]",
        'functools[{"name": "f", "arguments": "x"}]', "functools" + "[" * 100000,
    ],
)  # fmt: skip
def test_bad_functools_is_no_call(text):
    assert parse_functools(text) is None


def _run(fmt: str, text: str, step: int):
    parser = CallListParser(fmt)
    events = []
    for i in range(0, len(text), step):
        events += parser.feed(text[i : i + step])
    events += parser.finish()
    return events, parser.result()


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_any_chunking_gives_the_same_calls(step):
    text = '\n[get_weather(city="Paris")]'
    events, result = _run(PYTHONIC, text, step)
    assert events == [
        ToolCallStart(0, "get_weather"),
        ToolCallArgumentsDelta(0, '{"city": "Paris"}'),
    ]
    assert result.content == "" and _calls(result.tool_calls) == [
        ("get_weather", {"city": "Paris"})
    ]
    text = 'functools[{"name": "f", "arguments": {"a": 1}}]'
    assert _calls(_run(PHI4_MINI_JSON, text, step)[1].tool_calls) == [("f", {"a": 1})]


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_plain_answers_stream_as_content(step):
    events, result = _run(PYTHONIC, "It is sunny [really].", step)
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "It is sunny [really]."
    assert result.content == "It is sunny [really]." and not result.tool_calls
    if step == 1:  # content goes out as it comes, not at the end
        parser = CallListParser(PHI4_MINI_JSON)
        assert parser.feed("Hi") == [ContentDelta("Hi")]


@pytest.mark.parametrize(
    "fmt,text",
    [
        (PYTHONIC, "[f(a=1), oops"),
        (PYTHONIC, "[1] is a footnote"),
        (PHI4_MINI_JSON, "functools[{bad"),
    ],
)
def test_a_list_that_does_not_parse_stays_content(fmt, text):
    for step in (1, 1000):
        events, result = _run(fmt, text, step)
        assert result.content == text and not result.tool_calls
        assert [e for e in events if not isinstance(e, ContentDelta)] == []


def test_auto_reads_the_chat_template():
    def auto(name):
        return resolve_tool_call_parser("auto", (DATA / f"{name}.jinja").read_text())

    assert auto("gemma3_pythonic") == PYTHONIC
    assert auto("phi4_mini_tools") == PHI4_MINI_JSON
    assert auto("qwen3") == HERMES and auto("gemma3") == HERMES
    assert resolve_tool_call_parser("auto", None) == HERMES
    assert resolve_tool_call_parser("pythonic", None) == PYTHONIC
    with pytest.raises(ValueError, match="tool-call-parser"):
        resolve_tool_call_parser("mystery", None)
