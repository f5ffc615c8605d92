"""Turns user prompts into engine-core requests: tokenization, chat templates, validation."""

from __future__ import annotations

from typing import Any

from tokenmill.engine.core import validate_prompt
from tokenmill.engine.core_types import EngineCoreRequest
from tokenmill.model.chat_template import ChatTemplate
from tokenmill.model.tokenizer import Tokenizer
from tokenmill.sampling_params import SamplingParams

# A prompt is text, or {"prompt": text} / {"prompt_token_ids": [...]}.
PromptType = str | dict[str, Any] | list[int]


class InputProcessor:
    def __init__(
        self, tokenizer: Tokenizer, chat_template: ChatTemplate, max_model_len: int, vocab_size: int
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                ids = prompt["prompt_token_ids"]
                if not isinstance(ids, list) or not all(
                    isinstance(t, int) and not isinstance(t, bool) for t in ids
                ):
                    raise ValueError("prompt_token_ids: must be a list of integers")
                return prompt.get("prompt"), list(ids)
            if isinstance(prompt.get("prompt"), str):
                return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return None, list(prompt)
        raise ValueError(
            f"prompt: must be a string, a list of token ids or a dict, got {type(prompt).__name__}"
        )

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: must be a non-empty list")
        return self.chat_template.render(
            messages, add_generation_prompt, tools, **(chat_template_kwargs or {})
        )

    def make_requests(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        child_ids: list[str],
        arrival_time: float,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> list[EngineCoreRequest]:
        """One core request per sample; seeded samples get distinct, reproducible seeds."""
        reqs = []
        for i, cid in enumerate(child_ids):
            child_params = (
                params if params.seed is None or i == 0 else params.clone(seed=params.seed + i)
            )
            reqs.append(
                EngineCoreRequest(
                    cid, prompt_token_ids, child_params, arrival_time, priority, cache_salt
                )
            )
        return reqs

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        validate_prompt(prompt_token_ids, self.vocab_size, self.max_model_len)
        bad = [t for t in params.stop_token_ids or () if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"stop_token_ids: {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
            )
        if params.logit_bias:
            bad = [t for t in params.logit_bias if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"logit_bias: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})"
                )
