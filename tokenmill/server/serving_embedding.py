"""POST /v1/embeddings: every input becomes a pooling request, all admitted together and
batched by the scheduler beside generation; the vectors come back in input order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from tokenmill.engine.async_llm import GenerationRequest
from tokenmill.inputs.prompts import TokenizedPrompt, tokenize_prompt
from tokenmill.openai.embeddings import (
    MAX_EMBEDDING_INPUTS,
    EmbeddingRequest,
    embedding_response,
    encode_vector,
)
from tokenmill.outputs import RequestOutput
from tokenmill.pooling_params import PoolingParams
from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.server.errors import bad_request, from_value_error
from tokenmill.server.generation import final_outputs, submit
from tokenmill.server.state import AccessRecord, ServerState, new_id, off_loop


def _tokenize(value: str | list[int], tokenizer, param: str) -> TokenizedPrompt:
    if value == "":  # as OpenAI: an empty string is refused (a tokenizer may add tokens)
        raise ValueError(f"{param}: must not be an empty string")
    return tokenize_prompt(value, tokenizer, param)


def tokenize_inputs(
    value: Any, tokenizer, check: Callable[[list[int]], None]
) -> list[TokenizedPrompt]:
    """`input`: a string, token ids, or a list of either; none empty, at most 2048; `check`
    (the engine's prompt checks) runs on each, its error naming the input."""
    if isinstance(value, str) or (
        isinstance(value, list) and value and all(isinstance(t, int) for t in value)
    ):
        named = [("input", value)]
    elif not value:
        raise ValueError("input: must not be empty")
    elif len(value) > MAX_EMBEDDING_INPUTS:
        raise ValueError(f"input: at most {MAX_EMBEDDING_INPUTS} inputs per call, got {len(value)}")
    else:
        named = [(f"input.{i}", p) for i, p in enumerate(value)]
    prompts = []
    for param, item in named:
        prompt = _tokenize(item, tokenizer, param)
        try:
            check(prompt[1])
        except ValueError as e:  # "prompt: ..." of the engine's checks
            raise ValueError(f"{param}: {str(e).partition(': ')[2]}") from None
        prompts.append(prompt)
    return prompts


def _pooling_params(state: ServerState, req: EmbeddingRequest) -> PoolingParams:
    pooling = state.engine.engine_info.get("pooling") or {}
    hidden = pooling.get("hidden_size")
    if req.dimensions is not None and hidden is not None and req.dimensions > hidden:
        raise bad_request(
            f"dimensions: {req.dimensions} is more than this model's {hidden}", "dimensions"
        )
    return PoolingParams(normalize=req.normalize, dimensions=req.dimensions)


async def create_embedding(
    state: ServerState, req: EmbeddingRequest, raw: Request, request_id: str
):
    model = state.check_model(req.model)
    state.check_accepting()
    engine = state.engine
    params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)

    def check(ids: list[int]) -> None:
        engine.processor.validate(ids, params, pooling=True)

    try:
        prompts = await off_loop(tokenize_inputs, req.input, engine.tokenizer, check)
    except ValueError as e:
        raise from_value_error(e) from e
    pooling = _pooling_params(state, req)
    embedding_id = new_id("embd-")
    requests = [
        GenerationRequest(
            f"{embedding_id}-{i}",
            ids,
            params,
            text,
            pooling_params=pooling,
            lora_name=state.lora_for(req.model),
        )  # fmt: skip
        for i, (text, ids) in enumerate(prompts)
    ]
    prompt_tokens = sum(len(ids) for _, ids in prompts)
    record = AccessRecord(request_id, embedding_id, "embeddings", prompt_tokens)
    finals: list[RequestOutput] = []
    step = engine.max_in_flight or len(requests)  # a long list runs in waves the server holds
    for first in range(0, len(requests), step):
        part = requests[first : first + step]
        stream = await submit(engine, part, request_id)
        done = await final_outputs(raw, stream, request_id)
        finals += [done[r.request_id] for r in part]
    vectors = [encode_vector(f.pooled or [], req.encoding_format) for f in finals]
    record.finish_reasons = ["stop"] * len(finals)
    record.write()
    body = embedding_response(vectors, model, prompt_tokens)
    return JSONResponse(body, headers={"X-Request-Id": request_id})
