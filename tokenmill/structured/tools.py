"""Tool calls in the Hermes format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

One incremental, string-aware parser serves streaming and non-streaming alike: braces,
brackets, quotes and `</tool_call>` inside JSON strings are data, escapes are honoured, text
before, between and after calls is content. Feeding the same text in any chunking gives the
same events, so a stream reassembles to exactly the non-streaming result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tokenmill.structured.json_options import JSON_OPTIONS

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"
_ARGS_KEYS = ("arguments", "parameters")


@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    name: str


@dataclass
class ToolCallArgumentsDelta:
    index: int
    text: str


Event = ContentDelta | ToolCallStart | ToolCallArgumentsDelta


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    # False for a call cut off (max_tokens) or malformed after its name was streamed: its
    # arguments are what was seen, and it must not be returned as a call.
    complete: bool = True

    @property
    def valid(self) -> bool:
        """Complete, with arguments that parse as JSON."""
        if not self.complete:
            return False
        try:
            json.loads(self.arguments)
        except json.JSONDecodeError:
            return False
        return True


@dataclass
class ParseResult:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


def _held_tag_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag (kept back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class _CallScanner:
    """Scans one JSON object character by character, tracking its top-level keys."""

    def __init__(self) -> None:
        self.raw: list[str] = []
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False
        self.failed = False
        # top-level key tracking
        self.key_start: int | None = None  # raw position of the opening quote of a key
        self.current_key: str | None = None
        self.expect_key = True
        self.value_start: int | None = None
        self.values: dict[str, str] = {}
        self.open_key: str | None = None  # key whose value is being read

    def feed(self, ch: str) -> None:
        if self.done:
            return
        if not self.raw:
            if ch.isspace():
                return
            if ch != "{":
                self.failed = True
                return
        self.raw.append(ch)
        pos = len(self.raw) - 1
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                if self.key_start is not None:
                    self.current_key = json.loads("".join(self.raw[self.key_start :]))
                    self.key_start = None
            return
        if ch == '"':
            self.in_string = True
            if self.depth == 1 and self.expect_key:
                self.key_start = pos
            elif self.depth == 1 and self.value_start is None:
                self._start_value(pos)
            return
        if ch in "{[":
            if self.depth == 1 and not self.expect_key and self.value_start is None:
                self._start_value(pos)
            self.depth += 1
            return
        if ch in "}]":
            self.depth -= 1
            if self.depth == 0:
                self._end_value(pos)
                self.done = True
            return
        if self.depth == 1:
            if ch == ":":
                self.expect_key = False
                self.open_key = self.current_key
            elif ch == ",":
                self._end_value(pos)
                self.expect_key = True
            elif not ch.isspace() and self.value_start is None and not self.expect_key:
                self._start_value(pos)

    def _start_value(self, pos: int) -> None:
        self.value_start = pos

    def _end_value(self, pos: int) -> None:
        if self.value_start is not None and self.open_key is not None:
            # a repeated key keeps its first value (the one a stream has already sent)
            value = "".join(self.raw[self.value_start : pos]).rstrip()
            self.values.setdefault(self.open_key, value)
        self.value_start = None
        self.open_key = None

    def partial_value(self, key: str) -> str | None:
        """The raw text read so far of `key`'s value, while its first value is still open."""
        if self.open_key == key and self.value_start is not None and key not in self.values:
            return "".join(self.raw[self.value_start :])
        return None

    @property
    def text(self) -> str:
        return "".join(self.raw)


class ToolCallParser:
    """Incremental parser: feed() model text, get events; finish() at the end."""

    def __init__(self) -> None:
        self.buffer = ""  # text not yet resolved (possible tag prefix)
        self.in_call = False
        self.scanner: _CallScanner | None = None
        self.call_raw = ""  # the raw text since <tool_call>, for the fallback to content
        self.after_object = ""  # text between the closed JSON object and </tool_call>
        self.index = 0
        self.name_sent = False
        self.args_sent = 0  # characters of the arguments value already emitted
        self.calls: list[ToolCall] = []
        self.content: list[str] = []

    # ---------------------------------------------------------------- public

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        self.buffer += text
        while self.buffer:
            progressed = self._step_call(events) if self.in_call else self._step_text(events)
            if not progressed:
                break
        return events

    def finish(self) -> list[Event]:
        """End of output: an unfinished call whose JSON is complete counts; anything else is content."""
        events: list[Event] = []
        if self.in_call:
            if self.scanner is not None and self.scanner.done and self._call_ok():
                self._complete_call(events)
            elif self.name_sent:  # cut off mid-call (e.g. max_tokens): keep what was streamed
                self.calls.append(ToolCall(self._name() or "", self._streamed_args, False))
                self.index += 1
            else:
                self._emit_content(events, START_TAG + self.call_raw + self.buffer)
            self.in_call = False
        elif self.buffer:
            self._emit_content(events, self.buffer)
        self.buffer = ""
        return events

    def result(self) -> ParseResult:
        return ParseResult("".join(self.content), list(self.calls))

    # ---------------------------------------------------------------- states

    def _step_text(self, events: list[Event]) -> bool:
        i = self.buffer.find(START_TAG)
        if i != -1:
            self._emit_content(events, self.buffer[:i])
            self.buffer = self.buffer[i + len(START_TAG) :]
            self._open_call()
            return True
        held = _held_tag_prefix(self.buffer, START_TAG)
        self._emit_content(events, self.buffer[: len(self.buffer) - held])
        self.buffer = self.buffer[len(self.buffer) - held :]
        return False

    def _step_call(self, events: list[Event]) -> bool:
        scanner = self.scanner
        assert scanner is not None
        if not scanner.done:
            consumed = 0
            for ch in self.buffer:
                consumed += 1
                scanner.feed(ch)
                if scanner.done or scanner.failed:
                    break
            self.call_raw += self.buffer[:consumed]
            self.buffer = self.buffer[consumed:]
            if scanner.failed:
                return self._abandon_call(events)
            self._stream_progress(events)
            return scanner.done and bool(self.buffer)
        # JSON object closed: now expect (whitespace) </tool_call>
        self.after_object += self.buffer
        self.buffer = ""
        stripped = self.after_object.lstrip()
        if stripped.startswith(END_TAG):
            if not self._call_ok():
                return self._abandon_call(events, stripped[len(END_TAG) :])
            self._complete_call(events)
            self.buffer = stripped[len(END_TAG) :]
            return True
        if END_TAG.startswith(stripped):
            return False  # wait for more
        if not self._call_ok():
            return self._abandon_call(events, self.after_object)
        self._complete_call(events)  # a call without its end tag: keep the rest as content
        self.buffer = self.after_object
        return True

    # ---------------------------------------------------------------- helpers

    def _open_call(self) -> None:
        self.in_call = True
        self.scanner = _CallScanner()
        self.call_raw = ""
        self.after_object = ""
        self.name_sent = False
        self.args_sent = 0
        self._streamed_args = ""

    def _call_ok(self) -> bool:
        """A JSON object with a string name (arguments may be left out: a call without any)."""
        try:
            obj = json.loads(self.scanner.text)
        except (json.JSONDecodeError, AttributeError):
            return False
        return isinstance(obj, dict) and self._name() is not None

    def _args_key(self) -> str:
        """Which key holds the arguments: the first of "arguments" / "parameters" seen."""
        scanner = self.scanner
        for key in scanner.values:
            if key in _ARGS_KEYS:
                return key
        return scanner.open_key if scanner.open_key in _ARGS_KEYS else "arguments"

    def _name(self) -> str | None:
        raw = self.scanner.values.get("name") if self.scanner else None
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, str) else None

    def _stream_progress(self, events: list[Event]) -> None:
        """Emit the call's header once its name is known, then argument text as it grows."""
        scanner = self.scanner
        assert scanner is not None
        if not self.name_sent:
            name = self._name()
            if name is None:
                return
            self.name_sent = True
            events.append(ToolCallStart(self.index, name))
        partial = scanner.partial_value(self._args_key())
        if partial is None or partial.startswith('"'):
            return  # string-encoded arguments are decoded once complete
        partial = partial.rstrip()  # trailing whitespace may turn out to follow the value
        if len(partial) > self.args_sent:
            events.append(ToolCallArgumentsDelta(self.index, partial[self.args_sent :]))
            self.args_sent = len(partial)
            self._streamed_args = partial

    def _complete_call(self, events: list[Event]) -> None:
        name = self._name()
        assert name is not None
        raw_args = self.scanner.values.get(self._args_key(), "{}")
        args_value = json.loads(raw_args)
        arguments = args_value if isinstance(args_value, str) else raw_args
        if not self.name_sent:
            events.append(ToolCallStart(self.index, name))
            self.name_sent = True
        if isinstance(args_value, str):
            events.append(ToolCallArgumentsDelta(self.index, arguments))
        elif len(arguments) > self.args_sent:
            events.append(ToolCallArgumentsDelta(self.index, arguments[self.args_sent :]))
        self.calls.append(ToolCall(name, arguments))
        self.index += 1
        self.in_call = False
        self.scanner = None

    def _abandon_call(self, events: list[Event], rest: str = "") -> bool:
        """Not a well-formed call: its text (up to `rest`, the text after it) is content."""
        if self.name_sent:  # already announced: close it with what we have
            self.calls.append(ToolCall(self._name() or "", "{}", False))
            self.index += 1
        else:
            consumed = self.after_object[: len(self.after_object) - len(rest)]
            self._emit_content(events, START_TAG + self.call_raw + consumed)
        self.in_call = False
        self.scanner = None
        self.buffer = rest + self.buffer
        return bool(self.buffer)

    def _emit_content(self, events: list[Event], text: str) -> None:
        if text:
            self.content.append(text)
            if events and isinstance(events[-1], ContentDelta):
                events[-1] = ContentDelta(events[-1].text + text)
            else:
                events.append(ContentDelta(text))


def parse_tool_calls(text: str) -> ParseResult:
    parser = ToolCallParser()
    parser.feed(text)
    parser.finish()
    return parser.result()


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The documented fallback for chat templates without tool support (Hermes / Qwen style)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def tool_call_grammar(tools: list[dict[str, Any]], parallel: bool) -> str:
    """Lark grammar (llguidance dialect) forcing one or more calls of the given tools, each
    with arguments valid against that tool's JSON schema."""
    variants = []
    for tool in tools:
        fn = tool["function"]
        # no parameters: the function takes none, so its arguments are exactly {} (as OpenAI)
        params = fn.get("parameters") or {
            "type": "object",
            "properties": {},
            "additionalProperties": False,
        }
        variants.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    # the same bounded whitespace as response_format's JSON (llguidance's default is unbounded)
    schema = {**schema, "x-guidance": JSON_OPTIONS}
    repeat = '(("\\n" tool_call)*)' if parallel else ""
    return (
        f"start: tool_call {repeat}\n"
        'tool_call: "<tool_call>\\n" call "\\n</tool_call>"\n'
        f"call: %json {json.dumps(schema)}\n"
    )
