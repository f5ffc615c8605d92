"""Turns user prompts into engine-core requests: tokenization, chat templates, validation."""

from __future__ import annotations

from typing import Any

from tokenmill.inputs.chat import render_chat
from tokenmill.inputs.prompts import tokenize_prompt
from tokenmill.inputs.validation import validate_params, validate_prompt
from tokenmill.messages import EngineCoreRequest
from tokenmill.model.chat_template import ChatTemplate
from tokenmill.model.tokenizer import Tokenizer
from tokenmill.pooling_params import PoolingParams
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
        return tokenize_prompt(prompt, self.tokenizer)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, list[int]]:
        """(prompt text, token ids); message text stays text (see inputs/chat.py)."""
        return render_chat(
            self.chat_template,
            self.tokenizer,
            messages,
            tools,
            add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
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
        kv_transfer_params: dict | None = None,
        pooling_params: PoolingParams | None = None,
        lora_name: str | None = None,
    ) -> list[EngineCoreRequest]:
        """One core request per sample; seeded samples get distinct, reproducible seeds."""
        reqs = []
        for i, cid in enumerate(child_ids):
            child_params = (
                params if params.seed is None or i == 0 else params.clone(seed=params.seed + i)
            )
            reqs.append(
                EngineCoreRequest(
                    cid,
                    prompt_token_ids,
                    child_params,
                    arrival_time,
                    priority,
                    cache_salt,
                    kv_transfer_params,
                    pooling_params,
                    lora_name,
                )  # fmt: skip
            )
        return reqs

    def validate(
        self, prompt_token_ids: list[int], params: SamplingParams, pooling: bool = False
    ) -> None:
        validate_prompt(prompt_token_ids, self.vocab_size, self.max_model_len, pooling)
        validate_params(params, self.vocab_size)
