"""POST /v1/chat/completions."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.model.chat_template import ChatTemplateError
from tokenmill.outputs import RequestOutput
from tokenmill.server.errors import bad_request
from tokenmill.server.logprobs import chat_logprobs_content
from tokenmill.server.protocol import ChatCompletionRequest
from tokenmill.server.sampling import chat_logprobs, resolve_max_tokens, to_sampling_params
from tokenmill.server.state import (
    ServerState,
    engine_error,
    log_request,
    new_id,
    sse,
    sse_with_errors,
    until_disconnect,
)


def usage_dict(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def render_prompt(state: ServerState, req: ChatCompletionRequest) -> tuple[str, list[int]]:
    engine = state.engine
    messages = [m.to_template_dict() for m in req.messages]
    try:
        text = engine.chat_template.render(
            messages,
            add_generation_prompt=req.add_generation_prompt,
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


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, raw: Request, request_id: str
):
    model = state.check_model(req.model)
    engine = state.engine
    prompt, prompt_ids = render_prompt(state, req)
    requested = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    max_tokens = resolve_max_tokens(requested, len(prompt_ids), engine.max_model_len, param)
    top = chat_logprobs(req)
    params = to_sampling_params(req, max_tokens, top, req.stream)
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
            )
            return StreamingResponse(
                sse_with_errors(chunks, request_id),
                media_type="text/event-stream",
                headers={"X-Request-Id": request_id},
            )
        final = await until_disconnect(raw, _last(gen))
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
        choices.append(
            {
                "index": c.index,
                "message": {
                    "role": "assistant",
                    "content": c.text,
                    "refusal": None,
                    "tool_calls": [],
                },
                "logprobs": lp,
                "finish_reason": c.finish_reason,
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


async def _last(gen: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for out in gen:
        final = out
    if final is None:
        raise RuntimeError("the engine returned no output")
    return final


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
) -> AsyncIterator[str]:
    engine = state.engine
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    continuous = bool(req.stream_options and req.stream_options.continuous_usage_stats)
    top = chat_logprobs(req)
    n = req.n
    tokens_per_choice = [0] * n
    sent_role = [False] * n

    def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if include_usage:
            body["usage"] = usage
        return sse(body)

    out = first
    finished_out = None
    try:
        while True:
            for c in out.outputs:
                tokens_per_choice[c.index] += len(c.token_ids)
                if not sent_role[c.index]:
                    sent_role[c.index] = True
                    yield chunk(
                        [
                            {
                                "index": c.index,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ]
                    )
                if not c.text and not c.finished and not c.token_ids:
                    continue
                lp = None
                if top is not None and c.logprobs:
                    lp = {
                        "content": chat_logprobs_content(
                            engine.tokenizer, c.token_ids, c.logprobs, top
                        ),
                        "refusal": None,
                    }
                delta = {"content": c.text} if c.text else {}
                choice = {
                    "index": c.index,
                    "delta": delta,
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                }
                if c.finished:
                    choice["stop_reason"] = c.stop_reason
                if not delta and lp is None and not c.finished:
                    continue
                usage = (
                    usage_dict(prompt_tokens, sum(tokens_per_choice), out.num_cached_tokens)
                    if continuous
                    else None
                )
                yield chunk([choice], usage)
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
