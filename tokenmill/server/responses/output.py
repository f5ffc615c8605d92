"""Model text -> Responses output items, and the stream events that build them. Streaming
and non-streaming share this one path (the non-streamed output is the final state after
feeding the whole text), so a stream always reassembles to the non-streamed response.

With tools the text goes through the chat endpoint's tool-call parser: calls become
function_call items, the rest one message whose text is stripped of surrounding whitespace
(held back while streaming until more text shows it was inside)."""

from __future__ import annotations

import uuid
from typing import Any

from tokenmill.openai import responses_objects as ro
from tokenmill.server.responses.conversation import item_id
from tokenmill.structured.tools import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallParser,
    ToolCallStart,
)

Event = dict[str, Any]


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
        events.append(ro.output_text_delta(self._text_ref(), text))

    def _text_ref(self) -> dict[str, Any]:
        assert self._message is not None
        return ro.text_ref(self.items[self._message][ro.ID], self._message)

    def _open_message(self, events: list[Event]) -> None:
        self._message = len(self.items)
        item = ro.message_item(item_id("msg"), [], "in_progress")
        self.items.append(item)
        events.append(ro.output_item_added(self._message, _copy(item)))
        events.append(ro.content_part_added(self._text_ref(), ro.text_part("")))

    def _close_message(self, events: list[Event], incomplete: bool) -> None:
        text = "".join(self._text)
        item = self.items[self._message]
        item[ro.CONTENT] = [ro.text_part(text)]
        item[ro.STATUS] = "incomplete" if incomplete else "completed"
        ref = self._text_ref()
        events.append(ro.output_text_done(ref, text))
        events.append(ro.content_part_done(ref, ro.text_part(text)))
        events.append(ro.output_item_done(self._message, _copy(item)))

    # ------------------------------------------------------------ calls

    def _apply(self, ev: Any, events: list[Event]) -> None:
        if isinstance(ev, ContentDelta):
            self._content(ev.text, events)
        elif not self.parallel and ev.index > 0:
            return  # one call asked for: later ones are dropped
        elif isinstance(ev, ToolCallStart):
            index = len(self.items)
            self._calls[ev.index] = index
            call_id = f"call_{uuid.uuid4().hex[:24]}"
            item = ro.function_call_item(item_id("fc"), call_id, ev.name, "", "in_progress")
            self.items.append(item)
            events.append(ro.output_item_added(index, _copy(item)))
        elif isinstance(ev, ToolCallArgumentsDelta) and ev.text:
            index = self._calls[ev.index]
            item = self.items[index]
            item[ro.ARGUMENTS] += ev.text
            events.append(ro.function_call_arguments_delta(item[ro.ID], index, ev.text))

    def _close_finished_calls(self, events: list[Event]) -> None:
        """Calls the parser has finished (complete, or cut off / malformed: incomplete)."""
        assert self.parser is not None
        calls = self.parser.calls
        for n in range(self._closed_calls, len(calls)):
            index = self._calls.get(n)
            if index is None:
                continue
            item = self.items[index]
            item[ro.STATUS] = "completed" if calls[n].valid else "incomplete"
            events.append(ro.function_call_arguments_done(item[ro.ID], index, item[ro.ARGUMENTS]))
            events.append(ro.output_item_done(index, _copy(item)))
        self._closed_calls = len(calls)


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, ro.CONTENT: list(item[ro.CONTENT])} if ro.CONTENT in item else dict(item)
