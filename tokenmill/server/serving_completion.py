"""POST /v1/completions (legacy text completions)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from tokenmill.outputs import RequestOutput
from tokenmill.server.constraints import build_constraint, repetition_setting
from tokenmill.server.errors import bad_request
from tokenmill.server.logprobs import completion_logprobs
from tokenmill.server.protocol import CompletionRequest
from tokenmill.server.sampling import resolve_max_tokens, to_sampling_params
from tokenmill.server.serving_chat import usage_dict
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


def tokenize_prompts(
    state: ServerState, req: CompletionRequest
) -> list[tuple[str | None, list[int]]]:
    prompt = req.prompt
    tok = state.engine.tokenizer
    if isinstance(prompt, str):
        items: list[tuple[str | None, list[int]]] = [(prompt, tok.encode(prompt))]
    elif prompt and isinstance(prompt[0], int):
        items = [(None, list(prompt))]  # type: ignore[arg-type]
    elif prompt and isinstance(prompt[0], str):
        items = [(p, tok.encode(p)) for p in prompt]  # type: ignore[union-attr]
    else:
        items = [(None, list(p)) for p in prompt]  # type: ignore[union-attr]
    for i, (_, ids) in enumerate(items):
        if not ids:
            raise bad_request(
                "prompt: must not be empty", param="prompt" if len(items) == 1 else f"prompt.{i}"
            )
    return items


async def create_completion(
    state: ServerState, req: CompletionRequest, raw: Request, request_id: str
):
    model = state.check_model(req.model)
    if req.suffix:
        raise bad_request("suffix: is not supported by this server", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of: only best_of == n is supported", param="best_of")
    engine = state.engine
    prompts = tokenize_prompts(state, req)
    if req.echo and req.logprobs is not None and req.stream:
        raise bad_request("echo: cannot be combined with logprobs when streaming", param="echo")
    constraint = build_constraint(state.grammar_compiler, req)
    params_list = []
    for _, ids in prompts:
        max_tokens = resolve_max_tokens(
            req.max_tokens, len(ids), engine.max_model_len, "max_tokens"
        )
        params = to_sampling_params(req, max_tokens, req.logprobs, req.stream)
        params.structured_outputs = constraint
        params.repetition_detection = repetition_setting(req)
        if req.echo and req.logprobs is not None:
            params.prompt_logprobs = req.logprobs
        params_list.append(params)
    completion_id = new_id("cmpl")
    created = int(time.time())
    started = time.monotonic()
    gens = [
        engine.generate(
            f"{completion_id}-{i}",
            ids,
            params,
            prompt=text,
            priority=req.priority,
            cache_salt=req.cache_salt,
        )
        for i, ((text, ids), params) in enumerate(zip(prompts, params_list, strict=True))
    ]
    try:
        if req.stream:
            firsts = [await g.__anext__() for g in gens]
            chunks = _stream(
                state,
                req,
                gens,
                firsts,
                prompts,
                completion_id,
                created,
                model,
                started,
                request_id,
            )
            return StreamingResponse(
                sse_with_errors(chunks, request_id),
                media_type="text/event-stream",
                headers={"X-Request-Id": request_id},
            )
        finals = await until_disconnect(raw, asyncio.gather(*(final_output(g) for g in gens)))
    except (ValueError, RuntimeError) as e:
        for g in gens:
            await g.aclose()
        raise engine_error(e, request_id) from e

    choices = []
    prompt_tokens = completion_tokens = cached = 0
    for p_index, ((text, ids), final) in enumerate(zip(prompts, finals, strict=True)):
        prompt_tokens += len(ids)
        cached += final.num_cached_tokens
        for c in final.outputs:
            completion_tokens += len(c.token_ids)
            out_text = c.text
            lp = None
            if req.echo:
                prompt_text = text if text is not None else engine.tokenizer.decode(ids)
                out_text = prompt_text + c.text
            if req.logprobs is not None:
                lp = _logprobs(state, req, ids, final, c)
            choices.append(
                {
                    "index": p_index * req.n + c.index,
                    "text": out_text,
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                }
            )
    body = {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_dict(prompt_tokens, completion_tokens, cached),
        "system_fingerprint": None,
    }
    log_request(
        request_id=request_id,
        id=completion_id,
        endpoint="completions",
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_tokens=cached,
        latency_ms=round((time.monotonic() - started) * 1000, 1),
        finish_reason=[c["finish_reason"] for c in choices],
    )
    return JSONResponse(body, headers={"X-Request-Id": request_id})


def _logprobs(
    state: ServerState, req: CompletionRequest, ids: list[int], final: RequestOutput, c
) -> dict[str, Any]:
    tok = state.engine.tokenizer
    top = req.logprobs or 0
    if req.echo:
        prompt_lps = final.prompt_logprobs or [None] * len(ids)
        token_ids = list(ids) + list(c.token_ids)
        positions = list(prompt_lps) + list(c.logprobs or [])
        return completion_logprobs(tok, token_ids, positions, top)
    return completion_logprobs(tok, c.token_ids, c.logprobs or [], top)


async def _stream(
    state, req, gens, firsts, prompts, completion_id, created, model, started, request_id
):
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    tok = state.engine.tokenizer
    n = req.n
    counts = [0] * (len(gens) * n)
    echoed = [False] * (len(gens) * n)
    cached = 0

    def chunk(choices, usage=None) -> str:
        return stream_chunk(
            completion_id, "text_completion", created, model, choices, usage, include_usage
        )

    # Merge the prompts' streams in arrival order.
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, gen, first) -> None:
        try:
            await queue.put((i, first))
            if not first.finished:
                async for out in gen:
                    await queue.put((i, out))
        except BaseException as e:  # handed to the consumer, which re-raises
            await queue.put((i, e))

    tasks = [
        asyncio.create_task(pump(i, g, f))
        for i, (g, f) in enumerate(zip(gens, firsts, strict=True))
    ]
    done = 0
    try:
        while done < len(gens):
            i, out = await queue.get()
            if isinstance(out, BaseException):
                raise out
            cached += out.num_cached_tokens if out.finished else 0
            for c in out.outputs:
                index = i * n + c.index
                counts[index] += len(c.token_ids)
                text = c.text
                if req.echo and not echoed[index]:
                    echoed[index] = True
                    ptext, pids = prompts[i]
                    text = (ptext if ptext is not None else tok.decode(pids)) + text
                lp = (
                    completion_logprobs(tok, c.token_ids, c.logprobs or [], req.logprobs or 0)
                    if req.logprobs is not None and c.token_ids
                    else None
                )
                if not text and lp is None and not c.finished:
                    continue
                choice = {
                    "index": index,
                    "text": text,
                    "logprobs": lp,
                    "finish_reason": c.finish_reason,
                }
                if c.finished:
                    choice["stop_reason"] = c.stop_reason
                yield chunk([choice])
            if out.finished:
                done += 1
        if include_usage:
            prompt_tokens = sum(len(ids) for _, ids in prompts)
            yield chunk([], usage_dict(prompt_tokens, sum(counts), cached))
        log_request(
            request_id=request_id,
            id=completion_id,
            endpoint="completions",
            completion_tokens=sum(counts),
            latency_ms=round((time.monotonic() - started) * 1000, 1),
        )
    finally:
        for t in tasks:
            t.cancel()
        for g in gens:
            await g.aclose()
