"""POST /v1/chat/completions (with tools, structured outputs and streaming)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.model.chat_template import ChatTemplateError
from tokenmill.outputs import RequestOutput
from tokenmill.server.constraints import build_constraint, repetition_setting, tools_to_force
from tokenmill.server.errors import bad_request
from tokenmill.server.logprobs import chat_logprobs_content
from tokenmill.server.protocol import ChatCompletionRequest
from tokenmill.server.sampling import chat_logprobs, resolve_max_tokens, to_sampling_params
from tokenmill.server.state import (
    ServerState,
    engine_error,
    final_output,
    log_request,
    new_id,
    sse_with_errors,
    stream_chunk,
    until_disconnect,
)
from tokenmill.server.tool_messages import template_messages
from tokenmill.structured.tools import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallParser,
    ToolCallStart,
)


def usage_dict(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    if not req.tools or req.tool_choice == "none":
        return None
    return [t.model_dump(by_alias=True, exclude_none=True) for t in req.tools]


def render_prompt(state: ServerState, req: ChatCompletionRequest) -> tuple[str, list[int]]:
    engine = state.engine
    messages, tools = template_messages(engine.chat_template, req.messages, _tools(req))
    try:
        text = engine.chat_template.render(
            messages,
            add_generation_prompt=req.add_generation_prompt,
            tools=tools,
            **(req.chat_template_kwargs or {}),
        )
    except ChatTemplateError as e:
        raise bad_request(str(e), param="messages") from e
    if req.continue_final_message and messages[-1]["role"] == "assistant":
        # continue the assistant turn: cut the template's end-of-turn after its content
        last = messages[-1]["content"]
        cut = text.rfind(last)
        if cut != -1:
            text = text[: cut + len(last)]
    return text, engine.tokenizer.encode(text, add_special_tokens=False)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, raw: Request, request_id: str
):
    model = state.check_model(req.model)
    engine = state.engine
    forced = tools_to_force(req)
    prompt, prompt_ids = render_prompt(state, req)
    requested = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = resolve_max_tokens(requested, len(prompt_ids), engine.max_model_len, param)
    top = chat_logprobs(req)
    params = to_sampling_params(req, max_tokens, top, req.stream)
    params.structured_outputs = build_constraint(state.grammar_compiler, req, forced)
    params.repetition_detection = repetition_setting(req)
    parse_tools = _tools(req) is not None
    completion_id = new_id("chatcmpl")
    created = int(time.time())
    started = time.monotonic()
    try:
        gen = engine.generate(
            completion_id,
            prompt_ids,
            params,
            prompt=prompt,
            priority=req.priority,
            cache_salt=req.cache_salt,
        )
        if req.stream:
            first = await gen.__anext__()  # fail before the 200 when the engine rejects
            chunks = _stream(
                state,
                req,
                gen,
                first,
                completion_id,
                created,
                model,
                len(prompt_ids),
                started,
                request_id,
                parse_tools,
            )
            return StreamingResponse(
                sse_with_errors(chunks, request_id),
                media_type="text/event-stream",
                headers={"X-Request-Id": request_id},
            )
        final = await until_disconnect(raw, final_output(gen))
    except StopAsyncIteration:
        raise engine_error(RuntimeError("no output"), request_id) from None
    except (ValueError, RuntimeError) as e:
        raise engine_error(e, request_id) from e

    choices = []
    completion_tokens = 0
    for c in final.outputs:
        completion_tokens += len(c.token_ids)
        lp = None
        if top is not None and c.logprobs is not None:
            lp = {
                "content": chat_logprobs_content(engine.tokenizer, c.token_ids, c.logprobs, top),
                "refusal": None,
            }
        message: dict[str, Any] = {
            "role": "assistant",
            "content": c.text,
            "refusal": None,
            "tool_calls": [],
        }
        finish = c.finish_reason
        if parse_tools:
            parser = ToolCallParser()
            parser.feed(c.text)
            parser.finish()
            parsed = parser.result()
            calls = parsed.tool_calls if req.parallel_tool_calls else parsed.tool_calls[:1]
            if calls:
                message["content"] = parsed.content.strip() or None
                message["tool_calls"] = [
                    {
                        "id": _call_id(),
                        "type": "function",
                        "function": {"name": tc.name, "arguments": tc.arguments},
                    }
                    for tc in calls
                ]
                finish = "tool_calls"
        choices.append(
            {
                "index": c.index,
                "message": message,
                "logprobs": lp,
                "finish_reason": finish,
                "stop_reason": c.stop_reason,
            }
        )
    body = {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_dict(len(prompt_ids), completion_tokens, final.num_cached_tokens),
        "system_fingerprint": None,
    }
    _log(request_id, completion_id, "chat", len(prompt_ids), completion_tokens, final, started)
    return JSONResponse(body, headers={"X-Request-Id": request_id})


def _log(request_id, completion_id, endpoint, prompt_tokens, completion_tokens, final, started):
    first = final.metrics.get("first_token_time")
    arrival = final.metrics.get("arrival_time")
    log_request(
        request_id=request_id,
        id=completion_id,
        endpoint=endpoint,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=final.num_cached_tokens,
        ttft_ms=round((first - arrival) * 1000, 1) if first and arrival else None,
        latency_ms=round((time.monotonic() - started) * 1000, 1),
        finish_reason=[c.finish_reason for c in final.outputs],
    )


async def _stream(
    state: ServerState,
    req: ChatCompletionRequest,
    gen: AsyncIterator[RequestOutput],
    first: RequestOutput,
    completion_id: str,
    created: int,
    model: str,
    prompt_tokens: int,
    started: float,
    request_id: str,
    parse_tools: bool,
) -> AsyncIterator[str]:
    engine = state.engine
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    top = chat_logprobs(req)
    n = req.n
    tokens_per_choice = [0] * n
    sent_role = [False] * n
    parsers = [ToolCallParser() if parse_tools else None for _ in range(n)]
    call_ids: list[dict[int, str]] = [{} for _ in range(n)]

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        return stream_chunk(
            completion_id, "chat.completion.chunk", created, model, choices, usage, include_usage
        )

    def deltas(index: int, text: str, finished: bool) -> list[dict[str, Any]]:
        """Text -> OpenAI deltas (content and tool-call pieces) for one choice."""
        parser = parsers[index]
        if parser is None:
            return [{"content": text}] if text else []
        events = parser.feed(text) + (parser.finish() if finished else [])
        if not req.parallel_tool_calls:
            events = [e for e in events if isinstance(e, ContentDelta) or e.index == 0]
        out: list[dict[str, Any]] = []
        for ev in events:
            if isinstance(ev, ContentDelta):
                out.append({"content": ev.text})
            elif isinstance(ev, ToolCallStart):
                call_ids[index][ev.index] = _call_id()
                out.append({"tool_calls": [{"index": ev.index, "id": call_ids[index][ev.index], "type": "function",
                                            "function": {"name": ev.name, "arguments": ""}}]})  # fmt: skip
            elif isinstance(ev, ToolCallArgumentsDelta) and ev.text:
                out.append(
                    {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}
                )
        return out

    out = first
    finished_out = None
    try:
        while True:
            for c in out.outputs:
                tokens_per_choice[c.index] += len(c.token_ids)
                if not sent_role[c.index]:
                    sent_role[c.index] = True
                    yield chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}])  # fmt: skip
                lp = None
                if top is not None and c.logprobs:
                    lp = {
                        "content": chat_logprobs_content(
                            engine.tokenizer, c.token_ids, c.logprobs, top
                        ),
                        "refusal": None,
                    }
                pieces = deltas(c.index, c.text, c.finished)
                for i, delta in enumerate(pieces):
                    last = i == len(pieces) - 1
                    yield chunk(
                        [
                            {
                                "index": c.index,
                                "delta": delta,
                                "logprobs": lp if last else None,
                                "finish_reason": None,
                            }
                        ]
                    )
                if lp is not None and not pieces:
                    yield chunk(
                        [{"index": c.index, "delta": {}, "logprobs": lp, "finish_reason": None}]
                    )
                if c.finished:
                    finish = "tool_calls" if call_ids[c.index] else c.finish_reason
                    usage = (
                        usage_dict(prompt_tokens, sum(tokens_per_choice), out.num_cached_tokens)
                        if continuous
                        else None
                    )
                    yield chunk(
                        [
                            {
                                "index": c.index,
                                "delta": {},
                                "logprobs": None,
                                "finish_reason": finish,
                                "stop_reason": c.stop_reason,
                            }
                        ],
                        usage,
                    )
            if out.finished:
                finished_out = out
                break
            out = await gen.__anext__()
        if include_usage:
            yield chunk(
                [],
                usage_dict(prompt_tokens, sum(tokens_per_choice), finished_out.num_cached_tokens),
            )
        _log(
            request_id,
            completion_id,
            "chat",
            prompt_tokens,
            sum(tokens_per_choice),
            finished_out,
            started,
        )
    finally:
        if finished_out is None:  # client went away or the stream failed: free the engine's blocks
            await gen.aclose()
            await engine.abort(completion_id)
