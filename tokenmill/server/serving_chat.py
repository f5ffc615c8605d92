"""POST /v1/chat/completions (with tools, structured outputs and streaming)."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from tokenmill.engine.async_llm import GenerationRequest, OutputStream
from tokenmill.openai import completion_objects as co
from tokenmill.openai.protocol import ChatCompletionRequest
from tokenmill.outputs import CompletionOutput, RequestOutput
from tokenmill.server.chat_prompt import render_chat_request, request_tools
from tokenmill.server.constraints import build_constraint, tools_to_force
from tokenmill.server.errors import bad_request
from tokenmill.server.generation import event_stream, final_outputs, respond, submit
from tokenmill.server.kv_transfer import kv_transfer_request
from tokenmill.server.logprobs import chat_logprobs_content
from tokenmill.server.sampling import sampling_params
from tokenmill.server.state import (
    AccessRecord,
    ServerState,
    new_id,
    off_loop,
    stream_chunk,
    usage_options,
)
from tokenmill.structured.call_lists import HERMES, CallListParser, resolve_tool_call_parser
from tokenmill.structured.harmony import HarmonyParser, ReasoningText, parse_harmony
from tokenmill.structured.reasoning import (
    HARMONY,
    ReasoningParser,
    prompt_opens_thinking,
    resolve_reasoning_parser,
    split_reasoning,
)
from tokenmill.structured.tools import (
    ContentDelta,
    ParseResult,
    ToolCallArgumentsDelta,
    ToolCallParser,
    ToolCallStart,
)


async def render_prompt(state: ServerState, req: ChatCompletionRequest) -> tuple[str, list[int]]:
    """The request's prompt, rendered and tokenized off the event loop."""
    if req.special_tokens_in_content and not state.settings.allow_special_tokens_in_content:
        raise bad_request(
            "special_tokens_in_content: this server does not allow it (start it with "
            "--allow-special-tokens-in-content for trusted callers)",
            param="special_tokens_in_content",
        )
    engine = state.engine
    return await off_loop(render_chat_request, req, engine.tokenizer, engine.chat_template)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def finish_reason(engine_reason: str | None, has_calls: bool) -> str | None:
    """ "tool_calls" only for an output that ended on its own; a cut output says "length"."""
    return co.FINISH_TOOL_CALLS if has_calls and engine_reason == co.FINISH_STOP else engine_reason


def parallel_calls(req: ChatCompletionRequest) -> bool:
    """Several calls are returned unless a single one was asked for (or forced)."""
    return req.parallel_tool_calls is True or (
        req.parallel_tool_calls is None and req.tool_choice in (None, "auto")
    )


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, raw: Request, request_id: str
):
    model = state.check_model(req.model)
    state.check_accepting()
    engine = state.engine
    forced = tools_to_force(req)
    prompt, prompt_ids = await render_prompt(state, req)
    constraint = await build_constraint(state.get_grammar_compiler, req, forced)
    params = sampling_params(state, req, len(prompt_ids), constraint)
    reasoning = resolve_reasoning_parser(
        state.settings.reasoning_parser, engine.chat_template.source
    )
    if reasoning == HARMONY and params.skip_special_tokens:  # its markers are special tokens
        params = dataclasses.replace(params, skip_special_tokens=False)
    completion_id = new_id(co.CHAT_ID_PREFIX)
    record = AccessRecord(request_id, completion_id, "chat", len(prompt_ids))
    stream = await submit(
        engine,
        [
            GenerationRequest(
                completion_id,
                prompt_ids,
                params,
                prompt,
                req.priority,
                req.cache_salt,
                kv_transfer_request(req, engine.engine_info, 1),
                lora_name=state.lora_for(req.model),
            )  # fmt: skip
        ],
        request_id,
    )
    chat = _ChatOutput(
        state, req, completion_id, model, request_tools(req) is not None, params.logprobs
    )
    chat.reasoning = reasoning
    # a forced call is written in the Hermes format its grammar makes
    chat.tool_format = (
        HERMES
        if forced
        else resolve_tool_call_parser(state.settings.tool_call_parser, engine.chat_template.source)
    )
    chat.opens_thinking = prompt_opens_thinking(prompt)
    if req.stream:
        return event_stream(chat.stream(stream, record), request_id)
    final = (await final_outputs(raw, stream, request_id))[completion_id]
    return respond(chat.response(final), [final], record, request_id)


class _ChatOutput:
    """Builds the response (or its stream of chunks) of one chat request."""

    def __init__(
        self,
        state: ServerState,
        req: ChatCompletionRequest,
        completion_id: str,
        model: str,
        parse_tools: bool,
        top: int | None,
    ) -> None:
        self.state = state
        self.req = req
        self.completion_id = completion_id
        self.model = model
        self.created = int(time.time())
        self.parse_tools = parse_tools
        self.top = top
        self.parallel = parallel_calls(req)
        self.reasoning: str | None = None  # the reasoning parser in force (structured/reasoning)
        self.opens_thinking = False  # the prompt ends inside the template's <think>
        self.tool_format = HERMES  # structured/call_lists.py

    def _tool_parser(self) -> ToolCallParser | CallListParser:
        return ToolCallParser() if self.tool_format == HERMES else CallListParser(self.tool_format)

    def _logprobs(self, c: CompletionOutput) -> dict[str, Any] | None:
        if self.top is None or not c.logprobs:
            return None
        tok = self.state.engine.tokenizer
        return {
            "content": chat_logprobs_content(tok, c.token_ids, c.logprobs, self.top),
            "refusal": None,
        }

    # ------------------------------------------------------------ one response

    def response(self, final: RequestOutput) -> dict[str, Any]:
        choices = []
        completion_tokens = 0
        for c in final.outputs:
            completion_tokens += len(c.token_ids)
            text, reasoning, harmony = c.text, None, None
            if self.reasoning == HARMONY:
                harmony = parse_harmony(c.text)
                reasoning, text = harmony.reasoning, harmony.content
            elif self.reasoning is not None:
                reasoning, text = split_reasoning(
                    c.text, self.opens_thinking, self.reasoning == "deepseek_r1"
                )
            message = co.assistant_message(text)
            if self.reasoning is not None:
                message[co.REASONING_CONTENT] = reasoning
                if not text:  # all reasoning (cut inside it): no content, as streamed
                    message[co.CONTENT] = None
            calls = []
            if self.parse_tools:
                if harmony is not None:
                    parsed = ParseResult(harmony.content, harmony.tool_calls)
                else:
                    parser = self._tool_parser()
                    parser.feed(text)
                    parser.finish()
                    parsed = parser.result()
                # a call the token limit cut off is returned as far as it got, as it was
                # streamed (finish_reason "length"; its arguments are not whole JSON); one
                # cut otherwise is not returned, and a malformed one stayed content
                cut = c.finish_reason == "length"
                calls = [tc for tc in parsed.tool_calls if tc.valid or cut]
                calls = calls if self.parallel else calls[:1]
                if parsed.tool_calls:  # whitespace around calls is no content (as streamed)
                    message[co.CONTENT] = parsed.content if parsed.content.strip() else None
                    message[co.TOOL_CALLS] = [
                        co.tool_call(_call_id(), tc.name, tc.arguments) for tc in calls
                    ]
            finish = finish_reason(c.finish_reason, bool(calls))
            choices.append(
                co.chat_choice(
                    c.index, message, self._logprobs(c), finish, stop_reason=c.stop_reason
                )
            )
        usage = co.usage(len(final.prompt_token_ids), completion_tokens, final.num_cached_tokens)
        return co.completion(
            self.completion_id, co.CHAT_COMPLETION, self.created, self.model, choices, usage
        )

    # ------------------------------------------------------------ streaming

    def _reasoning_parser(self) -> ReasoningParser | HarmonyParser | None:
        if self.reasoning == HARMONY:
            return HarmonyParser()
        if self.reasoning is None:
            return None
        return ReasoningParser(self.opens_thinking, self.reasoning == "deepseek_r1")

    async def stream(self, outputs: OutputStream, record: AccessRecord) -> AsyncIterator[str]:
        req = self.req
        include_usage, continuous = usage_options(req)
        n = req.n
        tokens = [0] * n
        sent_role = [False] * n
        parsers = [self._tool_parser() if self.parse_tools else None for _ in range(n)]
        thoughts = [self._reasoning_parser() for _ in range(n)]
        call_ids: list[dict[int, str]] = [{} for _ in range(n)]
        # content that is only whitespace so far: held until text follows, dropped if calls do
        held: list[str | None] = [""] * n  # None once text was sent
        prompt_tokens = record.prompt_tokens
        cached = 0

        def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
            return stream_chunk(
                self.completion_id, co.CHAT_COMPLETION_CHUNK, self.created, self.model, choices,
                usage, include_usage,
            )  # fmt: skip

        def usage_so_far() -> dict[str, Any] | None:
            return co.usage(prompt_tokens, sum(tokens), cached) if continuous else None

        def deltas(index: int, text: str, finished: bool) -> list[dict[str, Any]]:
            """Text -> OpenAI deltas (reasoning, content and tool-call pieces) for one choice."""
            out: list[dict[str, Any]] = []
            thought = thoughts[index]
            events = None
            if isinstance(thought, HarmonyParser):  # reasoning, content and calls in one
                found = thought.feed(text) + (thought.finish() if finished else [])
                out += [co.reasoning_delta(e.text) for e in found if isinstance(e, ReasoningText)]
                events = [e for e in found if not isinstance(e, ReasoningText)]
                if not self.parse_tools:
                    events = [e for e in events if isinstance(e, ContentDelta)]
            elif thought is not None:
                split = thought.feed(text)
                if finished:
                    end = thought.finish()
                    split.reasoning, split.content = (split.reasoning + end.reasoning,
                                                      split.content + end.content)  # fmt: skip
                if split.reasoning:
                    out.append(co.reasoning_delta(split.reasoning))
                text = split.content
            if events is None:
                parser = parsers[index]
                if parser is None:
                    return out + [co.content_delta(text)] if text else out
                events = parser.feed(text) + (parser.finish() if finished else [])
            if not self.parallel:
                events = [e for e in events if isinstance(e, ContentDelta) or e.index == 0]
            for ev in events:
                if isinstance(ev, ContentDelta):
                    text = ev.text
                    if held[index] is not None:
                        text = held[index] + text
                        held[index] = None if text.strip() else text
                        if held[index] is not None:
                            continue
                    out.append(co.content_delta(text))
                elif isinstance(ev, ToolCallStart):
                    call_ids[index][ev.index] = _call_id()
                    start = co.tool_call_start(ev.index, call_ids[index][ev.index], ev.name)
                    out.append(co.tool_calls_delta(start))
                elif isinstance(ev, ToolCallArgumentsDelta) and ev.text:
                    out.append(co.tool_calls_delta(co.tool_call_arguments(ev.index, ev.text)))
            if finished and held[index] and not call_ids[index]:
                out.append(co.content_delta(held[index]))  # no calls: whitespace is the content
            return out

        try:
            async for out in outputs:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    if c.token_ids:
                        record.token()
                    tokens[c.index] += len(c.token_ids)
                    if not sent_role[c.index]:
                        sent_role[c.index] = True
                        yield chunk([co.delta_choice(c.index, co.role_delta())], usage_so_far())
                    lp = self._logprobs(c)
                    pieces = deltas(c.index, c.text, c.finished)
                    for i, delta in enumerate(pieces):
                        last = i == len(pieces) - 1
                        choice = co.delta_choice(c.index, delta, lp if last else None)
                        yield chunk([choice], usage_so_far())
                    if lp is not None and not pieces:
                        yield chunk([co.delta_choice(c.index, {}, lp)], usage_so_far())
                    if c.finished:
                        finish = finish_reason(c.finish_reason, bool(call_ids[c.index]))
                        record.finish_reasons.append(finish)
                        last = co.delta_choice(c.index, {}, None, finish, stop_reason=c.stop_reason)
                        yield chunk([last], usage_so_far())
            if include_usage:
                yield chunk([], co.usage(prompt_tokens, sum(tokens), cached))
            record.completion_tokens, record.cached_tokens = sum(tokens), cached
            record.write()
        finally:
            if not outputs.finished:  # client went away or the stream failed: free the blocks
                outputs.abort()
