"""POST /v1/completions (legacy text completions): one or several prompts, n samples each,
all admitted at once and streamed in the order the engine produces them."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from tokenmill.engine.async_llm import GenerationRequest, OutputStream
from tokenmill.inputs.prompts import TokenizedPrompt, tokenize_prompts
from tokenmill.openai import completion_objects as co
from tokenmill.openai.protocol import CompletionRequest
from tokenmill.outputs import CompletionOutput, RequestOutput
from tokenmill.server.constraints import build_constraint
from tokenmill.server.errors import bad_request, from_value_error
from tokenmill.server.generation import event_stream, final_outputs, respond, submit
from tokenmill.server.kv_transfer import kv_transfer_request
from tokenmill.server.logprobs import completion_logprobs
from tokenmill.server.sampling import sampling_params
from tokenmill.server.state import (
    AccessRecord,
    ServerState,
    new_id,
    off_loop,
    stream_chunk,
    usage_options,
)


async def create_completion(
    state: ServerState, req: CompletionRequest, raw: Request, request_id: str
):
    model = state.check_model(req.model)
    state.check_accepting()
    if req.suffix:
        raise bad_request("suffix: is not supported by this server", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of: only best_of == n is supported", param="best_of")
    if req.echo and req.logprobs is not None and req.stream:
        raise bad_request("echo: cannot be combined with logprobs when streaming", param="echo")
    engine = state.engine
    try:
        prompts = await off_loop(tokenize_prompts, req.prompt, engine.tokenizer)
    except ValueError as e:
        raise from_value_error(e) from e
    constraint = await build_constraint(state.get_grammar_compiler, req)
    completion_id = new_id(co.COMPLETION_ID_PREFIX)
    requests = []
    kv_transfer = kv_transfer_request(req, engine.engine_info, len(prompts))
    lora = state.lora_for(req.model)
    for i, (text, ids) in enumerate(prompts):
        params = sampling_params(state, req, len(ids), constraint)
        rid = f"{completion_id}-{i}"
        requests.append(
            GenerationRequest(
                rid, ids, params, text, req.priority, req.cache_salt, kv_transfer, lora_name=lora
            )
        )
    record = AccessRecord(request_id, completion_id, "completions", sum(len(p[1]) for p in prompts))
    stream = await submit(engine, requests, request_id)
    out = _CompletionOutput(state, req, completion_id, model, prompts)
    if req.stream:
        return event_stream(out.stream(stream, record), request_id)
    done = await final_outputs(raw, stream, request_id)
    finals = [done[r.request_id] for r in requests]
    return respond(out.response(finals), finals, record, request_id)


class _CompletionOutput:
    """Builds the response (or its stream of chunks) of one completions request."""

    def __init__(
        self,
        state: ServerState,
        req: CompletionRequest,
        completion_id: str,
        model: str,
        prompts: list[TokenizedPrompt],
    ) -> None:
        self.tokenizer = state.engine.tokenizer
        self.req = req
        self.completion_id = completion_id
        self.model = model
        self.created = int(time.time())
        self.prompts = prompts

    def _prompt_text(self, i: int) -> str:
        text, ids = self.prompts[i]
        return text if text is not None else self.tokenizer.decode(ids)

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        req = self.req
        choices = []
        prompt_tokens = completion_tokens = cached = 0
        for p_index, final in enumerate(finals):
            ids = self.prompts[p_index][1]
            prompt_tokens += len(ids)
            cached += final.num_cached_tokens
            for c in final.outputs:
                completion_tokens += len(c.token_ids)
                text = self._prompt_text(p_index) + c.text if req.echo else c.text
                lp = self._logprobs(ids, final, c) if req.logprobs is not None else None
                index = p_index * req.n + c.index
                choices.append(
                    co.text_choice(index, text, lp, c.finish_reason, stop_reason=c.stop_reason)
                )
        usage = co.usage(prompt_tokens, completion_tokens, cached)
        return co.completion(
            self.completion_id, co.TEXT_COMPLETION, self.created, self.model, choices, usage
        )

    def _logprobs(
        self, ids: list[int], final: RequestOutput, c: CompletionOutput
    ) -> dict[str, Any]:
        top = self.req.logprobs or 0
        if self.req.echo:
            prompt_lps = final.prompt_logprobs or [None] * len(ids)
            token_ids = list(ids) + list(c.token_ids)
            positions = list(prompt_lps) + list(c.logprobs or [])
            return completion_logprobs(self.tokenizer, token_ids, positions, top)
        return completion_logprobs(self.tokenizer, c.token_ids, c.logprobs or [], top)

    async def stream(self, outputs: OutputStream, record: AccessRecord) -> AsyncIterator[str]:
        req = self.req
        include_usage, continuous = usage_options(req)
        n = req.n
        index_of = {f"{self.completion_id}-{i}": i for i in range(len(self.prompts))}
        counts = [0] * (len(self.prompts) * n)
        offsets = [0] * (len(self.prompts) * n)  # text_offset of each choice's next token
        echoed = [False] * (len(self.prompts) * n)
        cached: dict[int, int] = {}

        def chunk(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
            return stream_chunk(
                self.completion_id, co.TEXT_COMPLETION, self.created, self.model, choices, usage,
                include_usage,
            )  # fmt: skip

        def usage_now() -> dict[str, Any]:
            return co.usage(record.prompt_tokens, sum(counts), sum(cached.values()))

        try:
            async for out in outputs:
                p_index = index_of[out.request_id]
                cached[p_index] = out.num_cached_tokens
                for c in out.outputs:
                    index = p_index * n + c.index
                    counts[index] += len(c.token_ids)
                    if c.token_ids:
                        record.token()
                    text = c.text
                    if req.echo and not echoed[index]:
                        echoed[index] = True
                        text = self._prompt_text(p_index) + text
                        offsets[index] = len(text) - len(c.text)
                    lp = None
                    if req.logprobs is not None and c.token_ids:
                        lp = completion_logprobs(
                            self.tokenizer, c.token_ids, c.logprobs or [], req.logprobs,
                            offsets[index],
                        )  # fmt: skip
                        offsets[index] = lp["text_offset"][-1] + len(lp["tokens"][-1])
                    if not text and lp is None and not c.finished:
                        continue
                    choice = co.text_choice(index, text, lp, c.finish_reason)
                    if c.finished:
                        choice[co.STOP_REASON] = c.stop_reason
                        record.finish_reasons.append(c.finish_reason)
                    yield chunk([choice], usage_now() if continuous else None)
            if include_usage:
                yield chunk([], usage_now())
            record.completion_tokens = sum(counts)
            record.cached_tokens = sum(cached.values())
            record.write()
        finally:
            if not outputs.finished:  # client went away or the stream failed: free the blocks
                outputs.abort()
