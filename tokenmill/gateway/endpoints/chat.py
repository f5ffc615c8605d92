"""/v1/chat/completions and /v1/completions: choices with text (message content, or `text`),
tool calls (chat), usage. Streams are rewritten chunk by chunk: text through each choice's
output filter (held back by its window), tool calls held whole until their choice finishes
when a tool policy applies, usage taken from the continuous usage the gateway asks for and
shown to the client only as it asked."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from tokenmill.gateway.endpoints.common import (
    ExchangeContext,
    TextFilter,
    TextRef,
    content_refs,
    error_payload,
)
from tokenmill.gateway.sse import Event
from tokenmill.openai import completion_objects as co
from tokenmill.openai.completion_objects import (
    CHOICES,
    CONTENT,
    DELTA,
    FINISH_REASON,
    FUNCTION,
    INDEX,
    LOGPROBS,
    MESSAGE,
    TEXT,
    TOOL_CALLS,
    USAGE,
    usage_tokens,
)
from tokenmill.openai.errors import ERROR


def _zero_usage() -> dict[str, Any]:
    return co.usage(0, 0, 0)


class ChatAdapter:
    endpoint = "chat"
    object_name = co.CHAT_COMPLETION
    chunk_name = co.CHAT_COMPLETION_CHUNK
    id_prefix = co.CHAT_ID_PREFIX + "-"

    # ------------------------------------------------------------ input

    def input_texts(self, body: dict[str, Any]) -> list[TextRef] | None:
        """The user-controlled strings (None: some cannot be scanned)."""
        refs: list[TextRef] = []
        messages = body.get("messages")
        if not isinstance(messages, list):
            return refs
        for message in messages:
            if isinstance(message, dict):
                refs += content_refs(message)
        return refs

    def wants_logprobs(self, body: dict[str, Any]) -> bool:
        return bool(body.get("logprobs"))

    def prepare_stream(self, body: dict[str, Any], ctx: ExchangeContext) -> None:
        """Usage in every chunk (the ledger's count even when the client leaves early)."""
        options = body.get(co.STREAM_OPTIONS)
        options = options if isinstance(options, dict) else {}
        ctx.client_include_usage = options.get(co.INCLUDE_USAGE) is True
        ctx.client_continuous_usage = options.get(co.CONTINUOUS_USAGE_STATS) is True
        body[co.STREAM_OPTIONS] = {
            **options,
            co.INCLUDE_USAGE: True,
            co.CONTINUOUS_USAGE_STATS: True,
        }

    # ------------------------------------------------------------ fallback

    def _choice(self, index: int, text: str) -> dict[str, Any]:
        message = co.assistant_message(text)
        return co.chat_choice(index, message, None, co.FINISH_CONTENT_FILTER)

    def _count(self, body: dict[str, Any]) -> int:
        n = body.get("n")
        return n if isinstance(n, int) and 1 <= n <= 128 else 1

    def fallback_json(self, body: dict[str, Any], text: str, ctx: ExchangeContext) -> dict:
        choices = [self._choice(i, text) for i in range(self._count(body))]
        completion_id = self.id_prefix + uuid.uuid4().hex
        created = int(time.time())
        return co.completion(
            completion_id, self.object_name, created, ctx.model, choices, _zero_usage()
        )

    def _text_delta(self, index: int, text: str) -> dict[str, Any]:
        return co.delta_choice(index, co.content_delta(text))

    def _finish_delta(self, index: int, reason: str) -> dict[str, Any]:
        return co.delta_choice(index, {}, None, reason)

    def fallback_events(self, body: dict[str, Any], text: str, ctx: ExchangeContext) -> list:
        completion_id = self.id_prefix + uuid.uuid4().hex
        head = co.envelope(completion_id, self.chunk_name, int(time.time()), ctx.model)
        events = []
        for i in range(self._count(body)):
            events.append(Event(co.chunk(head, [self._first_delta(i)])))
            events.append(Event(co.chunk(head, [self._text_delta(i, text)])))
            events.append(Event(co.chunk(head, [self._finish_delta(i, co.FINISH_CONTENT_FILTER)])))
        if ctx.client_include_usage:
            events.append(Event({**co.chunk(head, []), USAGE: _zero_usage()}))
        events.append(Event("[DONE]"))
        return events

    def _first_delta(self, index: int) -> dict[str, Any]:
        return co.delta_choice(index, co.role_delta())

    # ------------------------------------------------------------ output

    def usage_of(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        usage = obj.get(USAGE)
        return usage if isinstance(usage, dict) else None

    def tokens(self, usage: dict[str, Any] | None) -> tuple[int, int, int]:
        return usage_tokens(usage)

    async def transform_json(
        self, obj: dict[str, Any], ctx: ExchangeContext
    ) -> dict[str, Any] | None:
        """The whole response rewritten (None: an output rule blocked it)."""
        ctx.usage = self.usage_of(obj)
        for choice in obj.get(CHOICES) or []:
            if not isinstance(choice, dict):
                continue
            ctx.finish_reason = ctx.finish_reason or choice.get(FINISH_REASON)
            ref = self.choice_text(choice)
            if ref is not None and ref.text:
                step = await TextFilter(ctx).whole(ref.text)
                if step.stop is not None and step.replacement is None:
                    ctx.error_code = "guardrail_blocked"
                    return None
                if step.replacement is not None:  # nothing of the answer stays, calls neither
                    ref.set(step.replacement)
                    self.drop_calls(choice)
                    choice.update({FINISH_REASON: co.FINISH_CONTENT_FILTER, LOGPROBS: None})
                    continue
                if step.emit != ref.text:
                    ref.set(step.emit)
                    choice[LOGPROBS] = None
            self.police_calls(choice, ctx)
        return obj

    def choice_text(self, choice: dict[str, Any]) -> TextRef | None:
        message = choice.get(MESSAGE)
        if isinstance(message, dict) and isinstance(message.get(CONTENT), str):
            return TextRef(message, CONTENT)
        return None

    def drop_calls(self, choice: dict[str, Any]) -> None:
        if isinstance(choice.get(MESSAGE), dict):
            choice[MESSAGE][TOOL_CALLS] = []

    def police_calls(self, choice: dict[str, Any], ctx: ExchangeContext) -> None:
        message = choice.get(MESSAGE)
        if not isinstance(message, dict):
            return
        calls = message.get(TOOL_CALLS)
        if not isinstance(calls, list) or not calls:
            return
        kept, refusals = [], []
        for call in calls:
            fn = call.get(FUNCTION) or {} if isinstance(call, dict) else {}
            record = ctx.check_call(str(fn.get(co.NAME, "")), str(fn.get(co.ARGUMENTS, "")))
            if record.allowed:
                kept.append(call)
            else:
                refusals.append(ctx.policy.refusal if ctx.policy else "")
        if not refusals:
            return
        message[TOOL_CALLS] = kept
        text = "\n".join(dict.fromkeys(refusals))
        message[CONTENT] = f"{message[CONTENT]}\n{text}" if message.get(CONTENT) else text
        if not kept and choice.get(FINISH_REASON) == co.FINISH_TOOL_CALLS:
            choice[FINISH_REASON] = co.FINISH_STOP

    def stream_rewriter(self, body: dict[str, Any], ctx: ExchangeContext) -> ChoiceStreamRewriter:
        rewriter = ChoiceStreamRewriter(self, ctx)
        rewriter.expected = self._count(body)
        return rewriter

    # text accessors (completions override)
    def chunk_text(self, choice: dict[str, Any]) -> str | None:
        delta = choice.get(DELTA)
        return delta.get(CONTENT) if isinstance(delta, dict) else None

    def set_chunk_text(self, choice: dict[str, Any], text: str | None) -> None:
        delta = choice.get(DELTA)
        if isinstance(delta, dict):
            if text:
                delta[CONTENT] = text
            else:
                delta.pop(CONTENT, None)

    def empty_choice(self, choice: dict[str, Any]) -> bool:
        delta = choice.get(DELTA) or {}
        return not delta and choice.get(FINISH_REASON) is None and not choice.get(LOGPROBS)


class CompletionAdapter(ChatAdapter):
    endpoint = "completions"
    object_name = co.TEXT_COMPLETION
    chunk_name = co.TEXT_COMPLETION
    id_prefix = co.COMPLETION_ID_PREFIX + "-"

    def input_texts(self, body: dict[str, Any]) -> list[TextRef] | None:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [TextRef(body, "prompt")]
        if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
            return [TextRef(prompt, i) for i in range(len(prompt))]
        return None if prompt is not None else []  # token ids: nothing to scan

    def wants_logprobs(self, body: dict[str, Any]) -> bool:
        return body.get("logprobs") is not None or bool(body.get("echo"))

    def _choice(self, index: int, text: str) -> dict[str, Any]:
        return co.text_choice(index, text, None, co.FINISH_CONTENT_FILTER)

    def _count(self, body: dict[str, Any]) -> int:
        prompts = body.get("prompt")
        count = len(prompts) if isinstance(prompts, list) and prompts else 1
        return count * super()._count(body)

    def _text_delta(self, index: int, text: str) -> dict[str, Any]:
        return co.text_choice(index, text, None, None)

    def _finish_delta(self, index: int, reason: str) -> dict[str, Any]:
        return co.text_choice(index, "", None, reason)

    def _first_delta(self, index: int) -> dict[str, Any]:
        return self._text_delta(index, "")

    def choice_text(self, choice: dict[str, Any]) -> TextRef | None:
        return TextRef(choice, TEXT) if isinstance(choice.get(TEXT), str) else None

    def drop_calls(self, choice: dict[str, Any]) -> None:
        pass

    def police_calls(self, choice: dict[str, Any], ctx: ExchangeContext) -> None:
        pass  # completions have no tools

    def chunk_text(self, choice: dict[str, Any]) -> str | None:
        text = choice.get(TEXT)
        return text if isinstance(text, str) else None

    def set_chunk_text(self, choice: dict[str, Any], text: str | None) -> None:
        choice[TEXT] = text or ""

    def empty_choice(self, choice: dict[str, Any]) -> bool:
        return (
            not choice.get(TEXT) and choice.get(FINISH_REASON) is None and not choice.get(LOGPROBS)
        )


@dataclass
class _ChoiceState:
    filter: TextFilter
    calls: dict[int, dict[str, Any]] = field(default_factory=dict)  # index -> id/name/args
    closed: bool = False


class ChoiceStreamRewriter:
    """One streamed chat/completions response, event by event."""

    def __init__(self, adapter: ChatAdapter, ctx: ExchangeContext) -> None:
        self.adapter = adapter
        self.ctx = ctx
        self.choices: dict[int, _ChoiceState] = {}
        self.envelope: dict[str, Any] = {}
        self.cut = False  # the stream ended here (blocked): nothing more goes out
        self.expected = 1  # choices in the response (the upstream may stop once all closed)

    def _state(self, index: int) -> _ChoiceState:
        state = self.choices.get(index)
        if state is None:
            state = self.choices[index] = _ChoiceState(TextFilter(self.ctx))
        return state

    def _show_usage(self, chunk: dict[str, Any], final: bool) -> None:
        if self.ctx.client_continuous_usage:
            return
        if self.ctx.client_include_usage:
            if not final:
                chunk[USAGE] = None
        else:
            chunk.pop(USAGE, None)

    def _out(self, choices: list[dict[str, Any]]) -> Event:
        chunk = co.chunk(self.envelope, choices)
        if USAGE in self.envelope:
            chunk[USAGE] = self.ctx.usage if self.ctx.client_continuous_usage else None
            self._show_usage(chunk, final=False)
        return Event(chunk)

    async def on_event(self, event: Event) -> list[Event]:
        data = event.data
        if self.cut:
            return []
        if not isinstance(data, dict):
            return [event]  # [DONE]
        if ERROR in data:
            self.ctx.error_code = self.ctx.error_code or "upstream_error"
            return [event]
        self.envelope = {k: v for k, v in data.items() if k != CHOICES}
        if isinstance(data.get(USAGE), dict):
            self.ctx.usage = data[USAGE]
        choices = data.get(CHOICES)
        if not isinstance(choices, list):
            return [event]
        if not choices:  # the usage chunk
            if not (self.ctx.client_include_usage or self.ctx.client_continuous_usage):
                return []
            self._show_usage(data, final=True)
            return [event]
        out: list[Event] = []
        kept: list[dict[str, Any]] = []
        for choice in choices:
            if not isinstance(choice, dict) or not isinstance(choice.get(INDEX), int):
                kept.append(choice)
                continue
            events, keep = await self._choice(choice)
            if self.cut:
                return events
            out.extend(events)
            if keep is not None:
                kept.append(keep)
        if kept:
            self._show_usage(data, final=False)
            out.insert(0, Event({**data, CHOICES: kept}))
        return out

    async def _choice(self, choice: dict[str, Any]) -> tuple[list[Event], dict[str, Any] | None]:
        """Events to send in place of this choice (none: it is sent as rewritten) and its
        rewritten chunk (None: not sent on its own)."""
        ctx, adapter = self.ctx, self.adapter
        state = self._state(choice[INDEX])
        if state.closed:
            return [], None
        text = adapter.chunk_text(choice)
        if text:
            step = state.filter.feed(text)
            if step.stop is not None:
                return self._stop(choice[INDEX], state, step), None
            adapter.set_chunk_text(choice, step.emit)
            if step.emit:
                ctx.output_started()
        self._collect_calls(choice, state)
        finish = choice.get(FINISH_REASON)
        if finish is not None:
            ctx.finish_reason = ctx.finish_reason or finish
            step = await state.filter.finish()
            if step.stop is not None:
                return self._stop(choice[INDEX], state, step), None
            before = []
            if step.emit:
                ctx.output_started()
                before.append(self._out([adapter._text_delta(choice[INDEX], step.emit)]))
            calls, finish = self._release_calls(choice[INDEX], state, finish)
            choice[FINISH_REASON] = finish
            state.closed = True
            if before or calls:  # flushed text and held calls go before the finish chunk
                return [*before, *calls, self._out([choice])], None
            return [], choice
        return [], None if adapter.empty_choice(choice) else choice

    def _collect_calls(self, choice: dict[str, Any], state: _ChoiceState) -> None:
        delta = choice.get(DELTA)
        calls = delta.get(TOOL_CALLS) if isinstance(delta, dict) else None
        if not isinstance(calls, list):
            return
        for call in calls:
            if not isinstance(call, dict) or not isinstance(call.get(INDEX), int):
                continue
            slot = state.calls.setdefault(call[INDEX], {"id": None, "name": "", "arguments": ""})
            fn = call.get(FUNCTION) or {}
            slot["id"] = call.get(co.ID) or slot["id"]
            slot["name"] += fn.get(co.NAME) or ""
            slot["arguments"] += fn.get(co.ARGUMENTS) or ""
        if self.ctx.policy is not None:  # held until the choice finishes
            delta.pop(TOOL_CALLS, None)

    def _release_calls(
        self, index: int, state: _ChoiceState, finish: str
    ) -> tuple[list[Event], str]:
        ctx = self.ctx
        events: list[Event] = []
        allowed = 0
        refused = False
        for _, slot in sorted(state.calls.items()):
            record = ctx.check_call(slot["name"], slot["arguments"])
            if ctx.policy is None:
                continue  # already streamed as they came
            if record.allowed:
                call = {INDEX: allowed, **co.tool_call(slot["id"], slot["name"], slot["arguments"])}
                events.append(self._out([co.delta_choice(index, co.tool_calls_delta(call))]))
                allowed += 1
            else:
                refused = True
        if refused:
            events.append(self._out([self.adapter._text_delta(index, ctx.policy.refusal)]))
            if not allowed and finish == co.FINISH_TOOL_CALLS:
                finish = co.FINISH_STOP
        return events, finish

    def _stop(self, index: int, state: _ChoiceState, step) -> list[Event]:
        """An output rule stopped this choice: a block ends the stream with an error event;
        a fallback ends the choice with the configured answer."""
        state.closed = True
        ctx = self.ctx
        if step.replacement is None:
            ctx.error_code = "guardrail_blocked"
            self.cut = True
            return [Event(error_payload(step.stop)), Event("[DONE]")]
        ctx.finish_reason = co.FINISH_CONTENT_FILTER
        ctx.output_started()
        events = [
            self._out([self.adapter._text_delta(index, step.replacement)]),
            self._out([self.adapter._finish_delta(index, co.FINISH_CONTENT_FILTER)]),
        ]
        if sum(s.closed for s in self.choices.values()) >= self.expected:
            self.cut = True  # every choice answered: the rest of the generation is not needed
            if ctx.client_include_usage or ctx.client_continuous_usage:
                events.append(Event({**co.chunk(self.envelope, []), USAGE: ctx.usage}))
            events.append(Event("[DONE]"))
        return events
