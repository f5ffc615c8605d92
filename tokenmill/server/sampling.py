"""OpenAI request fields -> SamplingParams."""

from __future__ import annotations

from tokenmill.sampling_params import RequestOutputKind, SamplingParams
from tokenmill.server.errors import bad_request, from_value_error
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields


def resolve_max_tokens(
    requested: int | None, prompt_len: int, max_model_len: int, param: str, default: int
) -> int:
    """Max tokens for this request (`default`, or what still fits, when not given); 400
    context_length_exceeded when prompt + max_tokens overflow."""
    if prompt_len >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt is "
            f"{prompt_len} tokens, leaving no room for the completion.",
            param="messages" if param != "max_tokens" else "prompt",
            code="context_length_exceeded",
        )
    if requested is None:
        return min(default, max_model_len - prompt_len)
    if prompt_len + requested > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the completion). "
            "Please reduce the prompt or the completion length.",
            param=param,
            code="context_length_exceeded",
        )
    return requested


def to_sampling_params(
    req: SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    stream: bool,
    extra_stop_ids: list[int] | None = None,
) -> SamplingParams:
    try:
        return SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            seed=req.seed,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            stop=req.stop,
            stop_token_ids=list(req.stop_token_ids or []) + list(extra_stop_ids or []),
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=min(req.min_tokens, max_tokens),
            logprobs=logprobs,
            skip_special_tokens=req.skip_special_tokens,
            logit_bias={int(k): v for k, v in req.logit_bias.items()} if req.logit_bias else None,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
    except ValueError as e:
        raise from_value_error(e) from e


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs: requires logprobs to be true", param="top_logprobs")
    return (req.top_logprobs or 0) if req.logprobs else None


def completion_logprobs(req: CompletionRequest) -> int | None:
    return req.logprobs
