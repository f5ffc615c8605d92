"""GPT-OSS's harmony format in a completion: messages of a header (`<|channel|>analysis`,
`final`, or `commentary` with a recipient `to=functions.NAME`) and a body after `<|message|>`,
ended by `<|end|>`, `<|call|>` or `<|return|>`, the next one opened by `<|start|>assistant`.
The analysis channel is the reasoning, the final channel (and commentary without a recipient,
a preamble) the content, a message to `functions.NAME` a tool call whose body is its JSON
arguments (vLLM's openai_gptoss reasoning parser and openai tool parser report the same).

Incremental: feeding the text in any chunking gives the same events, so a stream reassembles
to the whole response.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tokenmill.structured.tools import (
    ContentDelta,
    Event,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_MARKERS = (MESSAGE, *ENDS, "<|start|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


@dataclass
class ReasoningText:
    text: str


@dataclass
class HarmonyResult:
    reasoning: str | None
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)


def _held(text: str) -> int:
    """Length of the longest suffix of text that could start a marker."""
    for n in range(min(len(text), max(map(len, _MARKERS)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in _MARKERS):
            return n
    return 0


class HarmonyParser:
    def __init__(self) -> None:
        self.buffer = ""
        self.in_body = False
        self.kind = "content"  # of the current body: "reasoning", "content" or "call"
        self.calls: list[ToolCall] = []
        self.reasoning: list[str] = []
        self.content: list[str] = []

    def feed(self, text: str) -> list[Event | ReasoningText]:
        self.buffer += text
        events: list[Event | ReasoningText] = []
        while True:
            if not self.in_body:
                at = self.buffer.find(MESSAGE)
                if at < 0:
                    break
                self._open(self.buffer[:at], events)
                self.buffer = self.buffer[at + len(MESSAGE) :]
                continue
            ends = [(self.buffer.find(e), e) for e in ENDS if e in self.buffer]
            if not ends:
                keep = _held(self.buffer)
                self._body(self.buffer[: len(self.buffer) - keep], events)
                self.buffer = self.buffer[len(self.buffer) - keep :]
                break
            at, end = min(ends)
            self._body(self.buffer[:at], events)
            self.buffer = self.buffer[at + len(end) :]
            self.in_body = False
            if self.kind == "call":
                self.calls[-1].complete = True
        return events

    def finish(self) -> list[Event | ReasoningText]:
        """The text held back at the end (a body cut off stays what it was)."""
        events: list[Event | ReasoningText] = []
        if self.in_body:
            self._body(self.buffer, events)
        elif self.buffer.strip() and "<|" not in self.buffer:  # no harmony at all: content
            self.kind = "content"
            self._body(self.buffer, events)
        self.buffer = ""
        return events

    def _open(self, header: str, events: list) -> None:
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        if recipient is not None:
            self.kind = "call"
            self.calls.append(ToolCall(recipient.group(1), "", complete=False))
            events.append(ToolCallStart(len(self.calls) - 1, recipient.group(1)))
        elif channel is not None and channel.group(1) == "analysis":
            self.kind = "reasoning"
        else:
            self.kind = "content"
        self.in_body = True

    def _body(self, text: str, events: list) -> None:
        if not text:
            return
        if self.kind == "call":
            self.calls[-1].arguments += text
            events.append(ToolCallArgumentsDelta(len(self.calls) - 1, text))
        elif self.kind == "reasoning":
            self.reasoning.append(text)
            events.append(ReasoningText(text))
        else:
            self.content.append(text)
            events.append(ContentDelta(text))

    def result(self) -> HarmonyResult:
        reasoning = "".join(self.reasoning) if self.reasoning else None
        return HarmonyResult(reasoning, "".join(self.content), list(self.calls))


def parse_harmony(text: str) -> HarmonyResult:
    parser = HarmonyParser()
    parser.feed(text)
    parser.finish()
    return parser.result()
