"""/v1/responses: message items' text through the output filters, function_call items
through the tool policy (a refused call becomes a message item with the refusal, in the
same place), usage from the response object. Streams are typed events renumbered by the
gateway; a function call's events are held until its item is done when a policy applies."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tokenmill.gateway.endpoints.common import (
    ExchangeContext,
    TextFilter,
    TextRef,
    blocked_message,
    content_refs,
)
from tokenmill.gateway.sse import Event
from tokenmill.openai import responses_objects as ro
from tokenmill.openai.responses_objects import (
    CONTENT,
    CONTENT_INDEX,
    DELTA,
    ITEM,
    ITEM_ID,
    OUTPUT,
    OUTPUT_INDEX,
    PART,
    RESPONSE,
    SEQUENCE_NUMBER,
    TEXT,
    TYPE,
)


def _message_item(text: str) -> dict[str, Any]:
    return ro.message_item("msg_" + uuid.uuid4().hex, [ro.text_part(text)], "completed")


class ResponsesAdapter:
    endpoint = "responses"

    def input_texts(self, body: dict[str, Any]) -> list[TextRef] | None:
        refs: list[TextRef] = []
        if isinstance(body.get("instructions"), str):
            refs.append(TextRef(body, "instructions"))
        items = body.get("input")
        if isinstance(items, str):
            refs.append(TextRef(body, "input"))
            return refs
        if not isinstance(items, list):
            return refs
        for item in items:
            if not isinstance(item, dict):
                continue
            if isinstance(item.get("output"), str):
                refs.append(TextRef(item, "output"))
            refs += content_refs(item)
        return refs

    def wants_logprobs(self, body: dict[str, Any]) -> bool:
        return False

    def prepare_stream(self, body: dict[str, Any], ctx: ExchangeContext) -> None:
        pass  # usage comes in the terminal event

    # ------------------------------------------------------------ fallback

    def fallback_json(self, body: dict[str, Any], text: str, ctx: ExchangeContext) -> dict:
        now = int(time.time())
        usage = ro.usage(0, 0, 0, cache_write_tokens=None)
        return ro.response_object(
            "resp_" + uuid.uuid4().hex, now, "completed", ro.settings(ctx.model),
            [_message_item(text)], usage, completed_at=now,
        )  # fmt: skip

    def fallback_events(self, body: dict[str, Any], text: str, ctx: ExchangeContext) -> list:
        done = self.fallback_json(body, text, ctx)
        start = {**done, ro.STATUS: "in_progress", OUTPUT: [], ro.USAGE: None, "completed_at": None}
        raw = [
            ro.response_event(ro.RESPONSE_CREATED, start),
            ro.response_event(ro.RESPONSE_IN_PROGRESS, start),
            *ro.message_events(0, done[OUTPUT][0], text),
            ro.response_event(ro.RESPONSE_COMPLETED, done),
        ]
        return [Event({**ev, SEQUENCE_NUMBER: i}, ev[TYPE]) for i, ev in enumerate(raw)]

    # ------------------------------------------------------------ output

    def usage_of(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        usage = obj.get(ro.USAGE)
        return usage if isinstance(usage, dict) else None

    def tokens(self, usage: dict[str, Any] | None) -> tuple[int, int, int]:
        return ro.usage_tokens(usage)

    async def transform_json(
        self, obj: dict[str, Any], ctx: ExchangeContext
    ) -> dict[str, Any] | None:
        if obj.get("object") != RESPONSE:
            return obj
        ctx.usage = self.usage_of(obj)
        ctx.finish_reason = ctx.finish_reason or obj.get(ro.STATUS)
        output = obj.get(OUTPUT)
        if not isinstance(output, list):
            return obj
        for i, item in enumerate(output):
            if not isinstance(item, dict):
                continue
            if item.get(TYPE) == ro.MESSAGE:
                for part in item.get(CONTENT) or []:
                    text = part.get(TEXT) if isinstance(part, dict) else None
                    if not isinstance(text, str) or not text:
                        continue
                    step = await TextFilter(ctx).whole(text)
                    if step.stop is not None and step.replacement is None:
                        ctx.error_code = "guardrail_blocked"
                        return None
                    part[TEXT] = step.replacement if step.replacement is not None else step.emit
            elif item.get(TYPE) == ro.FUNCTION_CALL:
                record = ctx.check_call(str(item.get(ro.NAME, "")), str(item.get(ro.ARGUMENTS, "")))
                if not record.allowed and ctx.policy is not None:
                    output[i] = _message_item(ctx.policy.refusal)
        return obj

    def stream_rewriter(
        self, body: dict[str, Any], ctx: ExchangeContext
    ) -> ResponsesStreamRewriter:
        return ResponsesStreamRewriter(self, ctx)


class ResponsesStreamRewriter:
    def __init__(self, adapter: ResponsesAdapter, ctx: ExchangeContext) -> None:
        self.adapter = adapter
        self.ctx = ctx
        self.seq = 0
        self.filters: dict[tuple[str, int], TextFilter] = {}
        self.stopped: set[tuple[str, int]] = set()
        self.held: dict[int, list[Event]] = {}  # output index -> held function-call events
        self.replaced: dict[int, dict[str, Any]] = {}  # output index -> refusal message item
        self.cut = False

    def _emit(self, ev: dict[str, Any]) -> Event:
        ev = {**ev, SEQUENCE_NUMBER: self.seq}
        self.seq += 1
        return Event(ev, ev.get(TYPE))

    def _filter(self, ev: dict[str, Any]) -> TextFilter:
        key = _text_key(ev)
        f = self.filters.get(key)
        if f is None:
            f = self.filters[key] = TextFilter(self.ctx)
        return f

    async def on_event(self, event: Event) -> list[Event]:
        ev = event.data
        if self.cut or not isinstance(ev, dict):
            return []
        kind = ev.get(TYPE, "")
        index = ev.get(OUTPUT_INDEX)
        if index in self.held:
            self.held[index].append(event)
            return self._close_call(index, ev) if kind == ro.OUTPUT_ITEM_DONE else []
        if kind == ro.OUTPUT_ITEM_ADDED and self.ctx.policy is not None:
            item = ev.get(ITEM) or {}
            if item.get(TYPE) == ro.FUNCTION_CALL and isinstance(index, int):
                self.held[index] = [event]
                return []
        if kind == ro.OUTPUT_TEXT_DELTA:
            key = _text_key(ev)
            if key in self.stopped:
                return []
            step = self._filter(ev).feed(str(ev.get(DELTA) or ""))
            if step.stop is not None:
                return self._stop(ev, key, step)
            if not step.emit:
                return []
            self.ctx.output_started()
            return [self._emit({**ev, DELTA: step.emit})]
        if kind == ro.OUTPUT_TEXT_DONE:
            key = _text_key(ev)
            out = []
            if key not in self.stopped:
                f = self._filter(ev)
                step = await f.finish()
                if step.stop is not None:
                    return self._stop(ev, key, step)
                if step.emit:
                    self.ctx.output_started()
                    out.append(self._emit(ro.output_text_delta(ro.text_ref_of(ev), step.emit)))
            return [*out, self._emit({**ev, TEXT: self._text_of(ev)})]
        if kind == ro.CONTENT_PART_DONE:
            part = ev.get(PART)
            if isinstance(part, dict) and TEXT in part:
                part = {**part, TEXT: self._text_of(ev)}
            return [self._emit({**ev, PART: part})]
        if kind == ro.OUTPUT_ITEM_DONE:
            item = ev.get(ITEM)
            if isinstance(item, dict) and item.get(TYPE) == ro.FUNCTION_CALL:  # no policy: audit
                self.ctx.check_call(str(item.get(ro.NAME, "")), str(item.get(ro.ARGUMENTS, "")))
            return [self._emit({**ev, ITEM: self._patch_item(item)})]
        if kind in ro.TERMINAL_EVENTS:
            response = ev.get(RESPONSE)
            if isinstance(response, dict):
                self.ctx.usage = self.adapter.usage_of(response)
                self.ctx.finish_reason = self.ctx.finish_reason or response.get(ro.STATUS)
                output = response.get(OUTPUT)
                if isinstance(output, list):
                    response = {**response, OUTPUT: [
                        self.replaced.get(i) or self._patch_item(item) for i, item in enumerate(output)
                    ]}  # fmt: skip
            return [self._emit({**ev, RESPONSE: response})]
        if kind == ro.ERROR_EVENT:
            self.ctx.error_code = self.ctx.error_code or "upstream_error"
        return [self._emit(ev)]

    def _text_of(self, ev: dict[str, Any]) -> str:
        return self._filter(ev).text

    def _patch_item(self, item: Any) -> Any:
        if not isinstance(item, dict) or item.get(TYPE) != ro.MESSAGE:
            return item
        content = []
        for i, part in enumerate(item.get(CONTENT) or []):
            key = (str(item.get(ro.ID)), i)
            if isinstance(part, dict) and TEXT in part and key in self.filters:
                part = {**part, TEXT: self.filters[key].text}
            content.append(part)
        return {**item, CONTENT: content}

    def _stop(self, ev: dict[str, Any], key: tuple[str, int], step) -> list[Event]:
        ctx = self.ctx
        self.stopped.add(key)
        if step.replacement is None:
            ctx.error_code = "guardrail_blocked"
            self.cut = True
            return [self._emit(ro.error_event("guardrail_blocked", blocked_message(step.stop)))]
        f = self.filters[key]
        f.emitted.append(step.replacement)
        ctx.finish_reason = "content_filter"
        ctx.output_started()
        return [self._emit(ro.output_text_delta(ro.text_ref_of(ev), step.replacement))]

    def _close_call(self, index: int, done: dict[str, Any]) -> list[Event]:
        events = self.held.pop(index)
        item = done.get(ITEM) or {}
        record = self.ctx.check_call(str(item.get(ro.NAME, "")), str(item.get(ro.ARGUMENTS, "")))
        if record.allowed:
            return [self._emit(e.data) for e in events]
        text = self.ctx.policy.refusal if self.ctx.policy else ""
        refusal = _message_item(text)
        self.replaced[index] = refusal
        return [self._emit(ev) for ev in ro.message_events(index, refusal, text)]


def _text_key(ev: dict[str, Any]) -> tuple[str, int]:
    """The content part a text event is about."""
    return (str(ev.get(ITEM_ID)), int(ev.get(CONTENT_INDEX) or 0))
