"""Prompts as the APIs accept them -> (text, token ids) pairs, written once for the server's
/v1/completions, the offline API and the router."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenmill.model.tokenizer import Tokenizer

# One prompt, tokenized: its text (None when given as ids) and its token ids.
TokenizedPrompt = tuple[str | None, list[int]]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def tokenize_prompt(prompt: Any, tokenizer: Tokenizer, param: str = "prompt") -> TokenizedPrompt:
    """One prompt: text, token ids, or (offline API) {"prompt": text} /
    {"prompt_token_ids": [...], "prompt": optional text}."""
    if isinstance(prompt, str):
        text, ids = prompt, tokenizer.encode(prompt)
    elif _is_ids(prompt):
        text, ids = None, list(prompt)
    elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        if not _is_ids(prompt["prompt_token_ids"]):
            raise ValueError("prompt_token_ids: must be a list of integers")
        text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
    elif isinstance(prompt, dict) and isinstance(prompt.get("prompt"), str):
        text, ids = prompt["prompt"], tokenizer.encode(prompt["prompt"])
    else:
        raise ValueError(
            f"{param}: must be a string, a list of token ids or a dict, got {type(prompt).__name__}"
        )
    if not ids:
        raise ValueError(f"{param}: must not be empty")
    return text, ids


def tokenize_prompts(prompt: Any, tokenizer: Tokenizer) -> list[TokenizedPrompt]:
    """/v1/completions' `prompt`: a string, token ids, a list of strings or of token-id
    lists. Every prompt must be non-empty, and there must be at least one."""
    if isinstance(prompt, str) or (_is_ids(prompt) and prompt):
        return [tokenize_prompt(prompt, tokenizer)]
    if not isinstance(prompt, Sequence) or not prompt:
        raise ValueError("prompt: must not be empty")
    return [tokenize_prompt(p, tokenizer, f"prompt.{i}") for i, p in enumerate(prompt)]
