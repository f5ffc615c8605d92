"""The tool-call parser: chunking-invariant on adversarial arguments (property test)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenmill.structured.tools import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallParser,
    ToolCallStart,
    parse_tool_calls,
)

ADVERSARIAL = [
    "((([{}])))",
    "}",
    '"}"',
    "</tool_call>",
    "<tool_call>",
    'say "hi"',
    "back\\slash",
    "ünï 日本 🎉",
    "",
    "{[",
    "\n\t",
]

json_leaf = st.one_of(
    st.sampled_from(ADVERSARIAL), st.text(max_size=12), st.integers(-10**6, 10**6), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(ADVERSARIAL + ["k", "a b"]), inner, max_size=3),
    ),
    max_leaves=8,
)
arguments = st.dictionaries(
    st.sampled_from(["city", "q", "}", "</tool_call>", "x y", "ü"]), json_value, max_size=4
)
call = st.tuples(
    st.sampled_from(["get_weather", "add", "search.v2", "f_1"]),
    arguments,
    st.booleans(),
    st.booleans(),
)
content = st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20) | st.sampled_from(
    ["", " ", "Sure: ", "done.", "a < b"]
)


def render(parts: list[str], calls: list[tuple[str, dict, bool, bool]]) -> str:
    text = parts[0]
    for (name, args, pretty, args_first), after in zip(calls, parts[1:], strict=True):
        obj = {"arguments": args, "name": name} if args_first else {"name": name, "arguments": args}
        body = json.dumps(obj, ensure_ascii=False, indent=2 if pretty else None)
        text += f"<tool_call>\n{body}\n</tool_call>{after}"
    return text


def parse_in_chunks(text: str, cuts: list[int]) -> tuple[object, list]:
    parser = ToolCallParser()
    events = []
    last = 0
    for cut in sorted(set(c % (len(text) + 1) for c in cuts)) + [len(text)]:
        events += parser.feed(text[last:cut])
        last = cut
    events += parser.finish()
    return parser.result(), events


@settings(max_examples=300, deadline=None)
@given(
    st.lists(call, max_size=3),
    st.lists(content, min_size=4, max_size=4),
    st.lists(st.integers(0, 10**6), max_size=30),
)
def test_rechunking_gives_identical_calls(calls, contents, cuts):
    text = render(contents[: len(calls) + 1], calls)
    whole = parse_tool_calls(text)
    chunked, events = parse_in_chunks(text, cuts)
    assert chunked == whole
    assert [c.name for c in whole.tool_calls] == [c[0] for c in calls]
    for parsed, (_, args, _, _) in zip(whole.tool_calls, calls, strict=True):
        assert json.loads(parsed.arguments) == args
    # the streamed events reassemble to the same calls and content
    names, arg_text, text_out = {}, {}, ""
    for ev in events:
        if isinstance(ev, ToolCallStart):
            names[ev.index] = ev.name
        elif isinstance(ev, ToolCallArgumentsDelta):
            assert ev.index in names, "arguments before the call's header"
            arg_text[ev.index] = arg_text.get(ev.index, "") + ev.text
        elif isinstance(ev, ContentDelta):
            text_out += ev.text
    assert [names[i] for i in sorted(names)] == [c.name for c in whole.tool_calls]
    assert [arg_text.get(i, "") for i in sorted(names)] == [c.arguments for c in whole.tool_calls]
    assert text_out == whole.content


def test_specific_adversarial_cases():
    text = (
        'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", '
        '"note": "</tool_call> and ((([{}])))"}}</tool_call> and <tool_call>{"name": "noop", "arguments": {}}'
        "</tool_call> bye"
    )
    result = parse_tool_calls(text)
    assert result.content == "Let me check.  and  bye"
    assert [c.name for c in result.tool_calls] == ["get_weather", "noop"]
    assert json.loads(result.tool_calls[0].arguments) == {
        "city": 'Pa"ris}',
        "note": "</tool_call> and ((([{}])))",
    }
    assert result.tool_calls[1].arguments == "{}"


def test_string_encoded_arguments_and_unclosed_call():
    r = parse_tool_calls(
        '<tool_call>{"name": "s", "arguments": "{\\"q\\": 1}"}'
    )  # no end tag at the end
    assert r.tool_calls[0].arguments == '{"q": 1}'


def test_malformed_call_stays_content():
    text = "before <tool_call>not json at all</tool_call> after"
    assert parse_tool_calls(text).content == text
    cut_early = parse_tool_calls('x <tool_call>{"na')  # no name yet: content
    assert cut_early.content == 'x <tool_call>{"na' and cut_early.tool_calls == []
    cut_late = parse_tool_calls(
        'x <tool_call>{"name": "f", "arguments": {"a": [1, 2'
    )  # max_tokens mid-call
    assert cut_late.content == "x " and [
        (c.name, c.arguments, c.complete, c.valid) for c in cut_late.tool_calls
    ] == [("f", '{"a": [1, 2', False, False)]


def test_a_malformed_call_stays_content_with_its_end_tag_in_any_chunking():
    """Found by the Responses output builder's property test: fed whole, the end tag of a
    call that is not a call was dropped from the content (fed in pieces, it was kept)."""
    text = '<tool_call>{"nme": 1}</tool_call> not a call'
    for cut in range(len(text) + 1):
        parser = ToolCallParser()
        parser.feed(text[:cut])
        parser.feed(text[cut:])
        parser.finish()
        assert parser.result().content == text and parser.result().tool_calls == []


def _streamed(events: list) -> tuple[list[tuple[str, str]], str]:
    """What a client reassembles from the events: (name, arguments) per call, content."""
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    content = ""
    for ev in events:
        if isinstance(ev, ToolCallStart):
            names[ev.index] = ev.name
        elif isinstance(ev, ToolCallArgumentsDelta):
            args[ev.index] = args.get(ev.index, "") + ev.text
        elif isinstance(ev, ContentDelta):
            content += ev.text
    return [(names[i], args.get(i, "")) for i in sorted(names)], content


@pytest.mark.parametrize(
    "text,calls",
    [
        ('<tool_call>{"name": "f"}</tool_call>', [("f", "{}")]),  # a call without arguments
        ('<tool_call>\n{"name": "now"}\n</tool_call>', [("now", "{}")]),
        ('<tool_call>{"name": "f", "name": "g", "arguments": {}}</tool_call>', [("f", "{}")]),
        (
            '<tool_call>{"name": "f", "arguments": {"a": 1}, "arguments": {"b": 2}}</tool_call>',
            [("f", '{"a": 1}')],
        ),  # fmt: skip
        (
            '<tool_call>{"name": "f", "parameters": {"a": 1}, "arguments": {"b": 2}}</tool_call>',
            [("f", '{"a": 1}')],
        ),  # fmt: skip
        (
            '<tool_call>{"arguments": {"a": 1}, "name": "f", "name": 3}</tool_call>',
            [("f", '{"a": 1}')],
        ),  # fmt: skip
    ],
    ids=[
        "no-arguments",
        "no-arguments-newlines",
        "two-names",
        "two-arguments",
        "parameters-then-arguments",
        "arguments-first",
    ],  # fmt: skip
)
def test_streamed_and_whole_agree_on_odd_calls(text, calls):
    """A name streamed early is the name returned whole: a repeated key keeps its first value,
    a call without arguments is a call with {} (it was a lost output: no content, no call)."""
    whole = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in whole.tool_calls] == calls
    assert all(c.valid for c in whole.tool_calls) and whole.content == ""
    for cut in range(len(text) + 1):
        parser = ToolCallParser()
        events = parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish()
        assert parser.result() == whole
        assert _streamed(events) == (calls, "")


def test_a_call_whose_name_is_not_a_string_stays_content():
    text = '<tool_call>{"name": 5, "arguments": {}}</tool_call>'
    assert parse_tool_calls(text).content == text and parse_tool_calls(text).tool_calls == []
