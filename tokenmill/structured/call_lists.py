"""Tool calls written as one list for the whole answer, as vLLM's tool-call parsers read them:
`pythonic` (`[get_weather(city="Paris"), ...]`: Gemma 3 and Llama 3.2 with vLLM's pythonic
templates) and `phi4_mini_json` (`functools[{"name": ..., "arguments": {...}}, ...]`:
Phi-4-mini).

An answer that opens with the list's marker is held until it ends and then parsed whole; one
that does not is content as it streams. A list that does not parse (bad syntax, a variable, a
call of an attribute) stays content, whole: hostile text never fails a request.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable

from tokenmill.structured.tools import (
    ContentDelta,
    Event,
    ParseResult,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

HERMES = "hermes"
PYTHONIC = "pythonic"
PHI4_MINI_JSON = "phi4_mini_json"
TOOL_CALL_PARSERS = (HERMES, PYTHONIC, PHI4_MINI_JSON)
TOOL_CALL_PARSER_CHOICES = ("auto", *TOOL_CALL_PARSERS)
_FUNCTOOLS = "functools"
_MAX_LIST_CHARS = 1 << 20  # an answer longer than this is not parsed as a call list


def resolve_tool_call_parser(name: str, chat_template_source: str | None) -> str:
    """The format in force for --tool-call-parser `name`; "auto" reads the chat template:
    one that asks for `functools[...]` or a python list of calls gets that parser."""
    if name == "auto":
        source = chat_template_source or ""
        if "functools[" in source:
            return PHI4_MINI_JSON
        return PYTHONIC if "[func_name1(" in source else HERMES
    if name not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"tool-call-parser: unknown {name!r} (one of {', '.join(TOOL_CALL_PARSER_CHOICES)})"
        )
    return name


def _literal(node: ast.expr) -> object:
    return ast.literal_eval(node)  # ValueError for names, calls, operators


def parse_pythonic(text: str) -> list[ToolCall] | None:
    """`[f(a=1), g(b="x")]` -> calls; None unless the whole text is such a list."""
    if len(text) > _MAX_LIST_CHARS:
        return None
    try:
        tree = ast.parse(text.strip(), mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for call in tree.elts:
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                return None
            if call.args or any(k.arg is None for k in call.keywords):
                return None  # positional or **kwargs: no named arguments to report
            args = {k.arg: _literal(k.value) for k in call.keywords}
            calls.append(ToolCall(call.func.id, json.dumps(args, ensure_ascii=False)))
        return calls
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


def parse_functools(text: str) -> list[ToolCall] | None:
    """`functools[{"name": "f", "arguments": {...}}]` -> calls; None unless the whole text is
    such a list."""
    body = text.strip()
    if not body.startswith(_FUNCTOOLS) or len(body) > _MAX_LIST_CHARS:
        return None
    try:
        items = json.loads(body[len(_FUNCTOOLS) :])
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(items, list) or not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if not isinstance(args, dict):
            return None
        calls.append(ToolCall(item["name"], json.dumps(args, ensure_ascii=False)))
    return calls


_FORMATS: dict[str, tuple[str, Callable[[str], list[ToolCall] | None]]] = {
    PYTHONIC: ("[", parse_pythonic),
    PHI4_MINI_JSON: (_FUNCTOOLS, parse_functools),
}


class CallListParser:
    """ToolCallParser's interface (feed / finish / result) for a call-list format."""

    def __init__(self, fmt: str) -> None:
        self.marker, self.parse = _FORMATS[fmt]
        self.held = ""  # text not yet given out
        self.state = "start"  # start -> list (held to the end) | content
        self.content: list[str] = []
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> list[Event]:
        if self.state == "content":
            return self._content(text)
        self.held += text
        if self.state == "start":
            head = re.sub(r"^\s+", "", self.held)
            if head.startswith(self.marker):
                self.state = "list"
            elif not self.marker.startswith(head):
                self.state = "content"
                text, self.held = self.held, ""
                return self._content(text)
        return []

    def finish(self) -> list[Event]:
        text, self.held = self.held, ""
        calls = self.parse(text) if self.state == "list" else None
        if not calls:
            return self._content(text) if text else []
        events: list[Event] = []
        for call in calls:
            index = len(self.calls)
            self.calls.append(call)
            events += [
                ToolCallStart(index, call.name),
                ToolCallArgumentsDelta(index, call.arguments),
            ]
        return events

    def result(self) -> ParseResult:
        return ParseResult("".join(self.content), list(self.calls))

    def _content(self, text: str) -> list[Event]:
        self.content.append(text)
        return [ContentDelta(text)] if text else []
