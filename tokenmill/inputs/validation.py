"""Checks of a tokenized request against the model (no torch, no engine import: the API
process runs them before anything reaches the engine core)."""

from __future__ import annotations

from tokenmill.sampling_params import SamplingParams


def first_outside(token_ids: list[int] | tuple[int, ...], vocab_size: int) -> int | None:
    """The first id outside [0, vocab_size), or None: min / max run in C, so an in-range
    list of any length costs microseconds of the event loop, not a Python step per id."""
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        return None
    return next(t for t in token_ids if not 0 <= t < vocab_size)


def validate_prompt(
    prompt_token_ids: list[int], vocab_size: int, max_model_len: int, pooling: bool = False
) -> None:
    """`pooling`: an embedding request, which generates nothing (its prompt may fill the
    context)."""
    if not prompt_token_ids:
        raise ValueError("prompt: must not be empty")
    if len(prompt_token_ids) > max_model_len - (0 if pooling else 1):
        why = "" if pooling else " (at least one token must remain for the output)"
        raise ValueError(
            f"prompt: {len(prompt_token_ids)} tokens do not fit the context length of "
            f"{max_model_len} tokens{why}"
        )
    bad = first_outside(prompt_token_ids, vocab_size)
    if bad is not None:
        raise ValueError(f"prompt: token id {bad} is outside the vocabulary [0, {vocab_size})")


def validate_params(params: SamplingParams, vocab_size: int) -> None:
    """Token ids and vocabulary-sized knobs must fit the model's vocabulary."""
    if params.top_k > vocab_size:
        raise ValueError(f"top_k: must be <= the vocabulary size {vocab_size}, got {params.top_k}")
    bad = first_outside(params.stop_token_ids or (), vocab_size)
    if bad is not None:
        raise ValueError(f"stop_token_ids: {bad} is outside the vocabulary [0, {vocab_size})")
    if params.logit_bias:
        bad = first_outside(list(params.logit_bias), vocab_size)
        if bad is not None:
            raise ValueError(
                f"logit_bias: token id {bad} is outside the vocabulary [0, {vocab_size})"
            )
