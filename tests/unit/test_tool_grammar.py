"""The grammar that forces tool calls (tool_choice "required" or a named function): each call
names an offered tool, its arguments follow that tool's schema, JSON layout is bounded as in
response_format, and a tool without parameters takes exactly {}."""

from __future__ import annotations

import json

import llguidance
import pytest

from tests.tiny_models import embedded_tokenizer
from tokenmill.structured.grammar import GrammarCompiler
from tokenmill.structured.spec import StructuredOutputsParams
from tokenmill.structured.tools import parse_tool_calls, tool_call_grammar

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
NOW = {"type": "function", "function": {"name": "now"}}  # no parameters


@pytest.fixture(scope="module")
def compiler():
    tok = embedded_tokenizer()
    return GrammarCompiler(tok, tok.vocab_size)


def accepts(compiler, grammar: str, text: str) -> bool:
    """The whole text is a complete output of the grammar."""
    tok = embedded_tokenizer()
    matcher = llguidance.LLMatcher(compiler.ll_tokenizer, grammar, log_level=0)
    ids = tok.encode_as_text(text)
    return (
        matcher.validate_tokens(ids) == len(ids)
        and matcher.consume_tokens(ids)
        and (matcher.is_accepting())
    )


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_follow_the_tools_schemas(compiler, parallel):
    grammar = compiler.compile(
        StructuredOutputsParams(grammar=tool_call_grammar([WEATHER, NOW], parallel))
    )
    good = call("get_weather", '{"city": "Paris", "days": 2}')
    assert accepts(compiler, grammar, good)
    assert accepts(compiler, grammar, call("now", "{}"))
    assert not accepts(compiler, grammar, call("get_weather", '{"days": 2}'))  # city required
    assert not accepts(compiler, grammar, call("get_weather", '{"city": 3}'))
    assert not accepts(compiler, grammar, call("unknown", "{}"))
    assert accepts(compiler, grammar, good + "\n" + call("now", "{}")) == parallel
    parsed = parse_tool_calls(good)
    assert json.loads(parsed.tool_calls[0].arguments) == {"city": "Paris", "days": 2}


def test_a_tool_without_parameters_takes_exactly_an_empty_object(compiler):
    grammar = compiler.compile(StructuredOutputsParams(grammar=tool_call_grammar([NOW], False)))
    assert accepts(compiler, grammar, call("now", "{}"))
    assert not accepts(compiler, grammar, call("now", '{"x": 1}'))


def test_forced_call_whitespace_is_bounded_as_in_response_format(compiler):
    grammar = compiler.compile(StructuredOutputsParams(grammar=tool_call_grammar([WEATHER], False)))
    assert accepts(compiler, grammar, call("get_weather", '{"city":' + " " * 16 + '"Oslo"}'))
    assert not accepts(compiler, grammar, call("get_weather", '{"city":' + " " * 40 + '"Oslo"}'))
    assert not accepts(compiler, grammar, call("get_weather", "{" + "\n" * 30 + '"city": "x"}'))
