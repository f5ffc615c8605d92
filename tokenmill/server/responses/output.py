"""Model text -> Responses output items, and the stream events that build them. Streaming
and non-streaming share this one path (the non-streamed output is the final state after
feeding the whole text), so a stream always reassembles to the non-streamed response.

With tools the text goes through the chat endpoint's tool-call parser: calls become
function_call items, the rest one message whose text is stripped of surrounding whitespace
(held back while streaming until more text shows it was inside)."""

from __future__ import annotations

import uuid
from typing import Any

from tokenmill.server.responses.conversation import item_id
from tokenmill.structured.tools import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallParser,
    ToolCallStart,
)

Event = dict[str, Any]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputBuilder:
    def __init__(self, parse_tools: bool, parallel: bool) -> None:
        self.parser = ToolCallParser() if parse_tools else None
        self.parallel = parallel
        self.items: list[dict[str, Any]] = []
        self._message: int | None = None  # output index of the message item
        self._text: list[str] = []
        self._held = ""  # trailing whitespace not sent yet (tools only)
        self._calls: dict[int, int] = {}  # parser call index -> output index
        self._closed_calls = 0  # parser calls already closed

    # ------------------------------------------------------------ public

    def feed(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self.parser is None:
            self._content(text, events)
            return events
        for ev in self.parser.feed(text):
            self._apply(ev, events)
        self._close_finished_calls(events)
        return events

    def finish(self, incomplete: bool) -> list[Event]:
        """The end of the output: close every item (an empty message if there are none)."""
        events: list[Event] = []
        if self.parser is not None:
            for ev in self.parser.finish():
                self._apply(ev, events)
            self._close_finished_calls(events)
        if self._message is None and not self.items:
            self._open_message(events)
        if self._message is not None:
            self._close_message(events, incomplete)
        return events

    # ------------------------------------------------------------ text

    def _content(self, text: str, events: list[Event]) -> None:
        if self.parser is not None:  # stripped: leading whitespace dropped, trailing held
            if self._message is None:
                text = text.lstrip()
            text = self._held + text
            body = text.rstrip()
            self._held = text[len(body) :]
            text = body
        if not text:
            return
        if self._message is None:
            self._open_message(events)
        self._text.append(text)
        events.append(
            {
                "type": "response.output_text.delta",
                **self._text_ref(),
                "delta": text,
                "logprobs": [],
            }
        )

    def _text_ref(self) -> dict[str, Any]:
        assert self._message is not None
        return {
            "item_id": self.items[self._message]["id"],
            "output_index": self._message,
            "content_index": 0,
        }

    def _open_message(self, events: list[Event]) -> None:
        self._message = len(self.items)
        item = {
            "id": item_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        self.items.append(item)
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": self._message,
                "item": _copy(item),
            }
        )
        events.append(
            {"type": "response.content_part.added", **self._text_ref(), "part": _text_part("")}
        )

    def _close_message(self, events: list[Event], incomplete: bool) -> None:
        text = "".join(self._text)
        item = self.items[self._message]
        item["content"] = [_text_part(text)]
        item["status"] = "incomplete" if incomplete else "completed"
        ref = self._text_ref()
        events.append({"type": "response.output_text.done", **ref, "text": text, "logprobs": []})
        events.append({"type": "response.content_part.done", **ref, "part": _text_part(text)})
        events.append(
            {
                "type": "response.output_item.done",
                "output_index": self._message,
                "item": _copy(item),
            }
        )

    # ------------------------------------------------------------ calls

    def _apply(self, ev: Any, events: list[Event]) -> None:
        if isinstance(ev, ContentDelta):
            self._content(ev.text, events)
        elif not self.parallel and ev.index > 0:
            return  # one call asked for: later ones are dropped
        elif isinstance(ev, ToolCallStart):
            index = len(self.items)
            self._calls[ev.index] = index
            item = {
                "id": item_id("fc"),
                "type": "function_call",
                "call_id": f"call_{uuid.uuid4().hex[:24]}",
                "name": ev.name,
                "arguments": "",
                "status": "in_progress",
            }
            self.items.append(item)
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": _copy(item)}
            )
        elif isinstance(ev, ToolCallArgumentsDelta) and ev.text:
            index = self._calls[ev.index]
            item = self.items[index]
            item["arguments"] += ev.text
            events.append(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": index,
                    "delta": ev.text,
                }
            )

    def _close_finished_calls(self, events: list[Event]) -> None:
        """Calls the parser has finished (complete, or cut off / malformed: incomplete)."""
        assert self.parser is not None
        calls = self.parser.calls
        for n in range(self._closed_calls, len(calls)):
            index = self._calls.get(n)
            if index is None:
                continue
            item = self.items[index]
            item["status"] = "completed" if calls[n].valid else "incomplete"
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "arguments": item["arguments"],
                }
            )
            events.append(
                {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}
            )
        self._closed_calls = len(calls)


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "content": list(item["content"])} if "content" in item else dict(item)
