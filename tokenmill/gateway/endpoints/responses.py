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


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(text: str) -> dict[str, Any]:
    return {
        "id": "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [_text_part(text)],
    }


def _usage(input_tokens: int = 0, cached: int = 0, output_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


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
        return {
            "id": "resp_" + uuid.uuid4().hex,
            "object": "response",
            "created_at": now,
            "completed_at": now,
            "status": "completed",
            "model": ctx.model,
            "output": [_message_item(text)],
            "usage": _usage(),
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "max_output_tokens": None,
            "metadata": {},
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "temperature": 1.0,
            "top_p": 1.0,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "user": None,
            "background": False,
        }

    def fallback_events(self, body: dict[str, Any], text: str, ctx: ExchangeContext) -> list:
        done = self.fallback_json(body, text, ctx)
        start = {**done, "status": "in_progress", "output": [], "usage": None, "completed_at": None}
        item = done["output"][0]
        opened = {**item, "status": "in_progress", "content": []}
        ref = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        raw = [
            {"type": "response.created", "response": start},
            {"type": "response.in_progress", "response": start},
            {"type": "response.output_item.added", "output_index": 0, "item": opened},
            {"type": "response.content_part.added", **ref, "part": _text_part("")},
            {"type": "response.output_text.delta", **ref, "delta": text, "logprobs": []},
            {"type": "response.output_text.done", **ref, "text": text, "logprobs": []},
            {"type": "response.content_part.done", **ref, "part": _text_part(text)},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": done},
        ]
        return [Event({**ev, "sequence_number": i}, ev["type"]) for i, ev in enumerate(raw)]

    # ------------------------------------------------------------ output

    def usage_of(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        usage = obj.get("usage")
        return usage if isinstance(usage, dict) else None

    def tokens(self, usage: dict[str, Any] | None) -> tuple[int, int, int]:
        if not isinstance(usage, dict):
            return 0, 0, 0
        details = usage.get("input_tokens_details") or {}
        return (
            int(usage.get("input_tokens") or 0),
            int(details.get("cached_tokens") or 0),
            int(usage.get("output_tokens") or 0),
        )

    async def transform_json(
        self, obj: dict[str, Any], ctx: ExchangeContext
    ) -> dict[str, Any] | None:
        if obj.get("object") != "response":
            return obj
        ctx.usage = self.usage_of(obj)
        ctx.finish_reason = ctx.finish_reason or obj.get("status")
        output = obj.get("output")
        if not isinstance(output, list):
            return obj
        for i, item in enumerate(output):
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                for part in item.get("content") or []:
                    text = part.get("text") if isinstance(part, dict) else None
                    if not isinstance(text, str) or not text:
                        continue
                    step = await TextFilter(ctx).whole(text)
                    if step.stop is not None and step.replacement is None:
                        ctx.error_code = "guardrail_blocked"
                        return None
                    part["text"] = step.replacement if step.replacement is not None else step.emit
            elif item.get("type") == "function_call":
                record = ctx.check_call(str(item.get("name", "")), str(item.get("arguments", "")))
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
        ev = {**ev, "sequence_number": self.seq}
        self.seq += 1
        return Event(ev, ev.get("type"))

    def _filter(self, ev: dict[str, Any]) -> TextFilter:
        key = (str(ev.get("item_id")), int(ev.get("content_index") or 0))
        f = self.filters.get(key)
        if f is None:
            f = self.filters[key] = TextFilter(self.ctx)
        return f

    async def on_event(self, event: Event) -> list[Event]:
        ev = event.data
        if self.cut or not isinstance(ev, dict):
            return []
        kind = ev.get("type", "")
        index = ev.get("output_index")
        if index in self.held:
            self.held[index].append(event)
            return self._close_call(index, ev) if kind == "response.output_item.done" else []
        if kind == "response.output_item.added" and self.ctx.policy is not None:
            item = ev.get("item") or {}
            if item.get("type") == "function_call" and isinstance(index, int):
                self.held[index] = [event]
                return []
        if kind == "response.output_text.delta":
            key = (str(ev.get("item_id")), int(ev.get("content_index") or 0))
            if key in self.stopped:
                return []
            step = self._filter(ev).feed(str(ev.get("delta") or ""))
            if step.stop is not None:
                return self._stop(ev, key, step)
            if not step.emit:
                return []
            self.ctx.output_started()
            return [self._emit({**ev, "delta": step.emit})]
        if kind == "response.output_text.done":
            key = (str(ev.get("item_id")), int(ev.get("content_index") or 0))
            out = []
            if key not in self.stopped:
                f = self._filter(ev)
                step = await f.finish()
                if step.stop is not None:
                    return self._stop(ev, key, step)
                if step.emit:
                    self.ctx.output_started()
                    delta = {
                        k: ev[k] for k in ("item_id", "output_index", "content_index") if k in ev
                    }
                    out.append(self._emit({"type": "response.output_text.delta", **delta,
                                           "delta": step.emit, "logprobs": []}))  # fmt: skip
            return [*out, self._emit({**ev, "text": self._text_of(ev)})]
        if kind == "response.content_part.done":
            part = ev.get("part")
            if isinstance(part, dict) and "text" in part:
                part = {**part, "text": self._text_of(ev)}
            return [self._emit({**ev, "part": part})]
        if kind == "response.output_item.done":
            item = ev.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":  # no policy: audit
                self.ctx.check_call(str(item.get("name", "")), str(item.get("arguments", "")))
            return [self._emit({**ev, "item": self._patch_item(item)})]
        if kind in ("response.completed", "response.incomplete", "response.failed"):
            response = ev.get("response")
            if isinstance(response, dict):
                self.ctx.usage = self.adapter.usage_of(response)
                self.ctx.finish_reason = self.ctx.finish_reason or response.get("status")
                output = response.get("output")
                if isinstance(output, list):
                    response = {**response, "output": [
                        self.replaced.get(i) or self._patch_item(item) for i, item in enumerate(output)
                    ]}  # fmt: skip
            return [self._emit({**ev, "response": response})]
        if kind == "error":
            self.ctx.error_code = self.ctx.error_code or "upstream_error"
        return [self._emit(ev)]

    def _text_of(self, ev: dict[str, Any]) -> str:
        return self._filter(ev).text

    def _patch_item(self, item: Any) -> Any:
        if not isinstance(item, dict) or item.get("type") != "message":
            return item
        content = []
        for i, part in enumerate(item.get("content") or []):
            key = (str(item.get("id")), i)
            if isinstance(part, dict) and "text" in part and key in self.filters:
                part = {**part, "text": self.filters[key].text}
            content.append(part)
        return {**item, "content": content}

    def _stop(self, ev: dict[str, Any], key: tuple[str, int], step) -> list[Event]:
        ctx = self.ctx
        self.stopped.add(key)
        if step.replacement is None:
            ctx.error_code = "guardrail_blocked"
            self.cut = True
            return [self._emit({"type": "error", "code": "guardrail_blocked",
                                "message": blocked_message(step.stop), "param": None})]  # fmt: skip
        f = self.filters[key]
        f.emitted.append(step.replacement)
        ctx.finish_reason = "content_filter"
        ctx.output_started()
        delta = {k: ev[k] for k in ("item_id", "output_index", "content_index") if k in ev}
        return [self._emit({"type": "response.output_text.delta", **delta,
                            "delta": step.replacement, "logprobs": []})]  # fmt: skip

    def _close_call(self, index: int, done: dict[str, Any]) -> list[Event]:
        events = self.held.pop(index)
        item = done.get("item") or {}
        record = self.ctx.check_call(str(item.get("name", "")), str(item.get("arguments", "")))
        if record.allowed:
            return [self._emit(e.data) for e in events]
        refusal = _message_item(self.ctx.policy.refusal if self.ctx.policy else "")
        self.replaced[index] = refusal
        text = refusal["content"][0]["text"]
        ref = {"item_id": refusal["id"], "output_index": index, "content_index": 0}
        opened = {**refusal, "status": "in_progress", "content": []}
        return [
            self._emit(
                {"type": "response.output_item.added", "output_index": index, "item": opened}
            ),
            self._emit({"type": "response.content_part.added", **ref, "part": _text_part("")}),
            self._emit(
                {"type": "response.output_text.delta", **ref, "delta": text, "logprobs": []}
            ),
            self._emit({"type": "response.output_text.done", **ref, "text": text, "logprobs": []}),
            self._emit({"type": "response.content_part.done", **ref, "part": _text_part(text)}),
            self._emit(
                {"type": "response.output_item.done", "output_index": index, "item": refusal}
            ),
        ]
