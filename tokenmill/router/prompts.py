"""A request's token ids and block hashes, computed exactly as the engine computes them:
the same tokenizer and chat template (the server's own `render_chat_request` and
`tokenize_prompts`), the same chained hash with the request's `cache_salt`, for each block
size the replicas use."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tokenmill.inputs.prompts import tokenize_prompts
from tokenmill.kv.hashing import block_hashes, external_hash
from tokenmill.server.chat_prompt import render_chat_request
from tokenmill.server.errors import APIError
from tokenmill.server.protocol import ChatCompletionRequest, CompletionRequest


@dataclass
class RequestKey:
    """What routing needs to know about a request."""

    token_ids: tuple[int, ...]  # the (first) prompt
    num_tokens: int  # prompt tokens of all its sequences
    num_seqs: int = 1
    cache_salt: str | None = None
    session: str | None = None
    lora_name: str | None = None  # the LoRA adapter the request's `model` names
    _hashes: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def hashes(self, block_size: int) -> tuple[int, ...]:
        """The 64-bit event hashes of the prompt's full blocks."""
        cached = self._hashes.get(block_size)
        if cached is None:
            full = block_hashes(
                self.token_ids, block_size, self.cache_salt, lora_name=self.lora_name
            )
            cached = self._hashes[block_size] = tuple(external_hash(h) for h in full)
        return cached


def served_adapters(replicas: Iterable[Any]) -> set[str]:
    """The LoRA adapters the replicas serve, as their /server_info lists them (health
    checks read it)."""
    names: set[str] = set()
    for replica in replicas:
        info = replica.info if isinstance(replica.info, dict) else {}
        listed = info.get("lora_adapters")
        if isinstance(listed, list):
            names.update(n for n in listed if isinstance(n, str))
    return names


class PromptHasher:
    """Turns request bodies into RequestKeys with the model's tokenizer and chat template."""

    def __init__(self, tokenizer: Any, chat_template: Any) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template

    @classmethod
    def from_model(cls, model: str | None) -> PromptHasher:
        from tokenmill.model.model_files import read_model_info

        files = read_model_info(model)
        return cls(files.tokenizer, files.chat_template)

    def key(
        self,
        endpoint: str,
        body: dict[str, Any],
        session: str | None = None,
        adapters: frozenset[str] | set[str] = frozenset(),
    ) -> RequestKey:
        """Raises ValueError when the body is not a valid request (a replica will say why).
        `adapters`: the replicas' LoRA adapter names; a `model` among them keys the blocks
        by adapter, as the engine does."""
        try:
            if endpoint == "chat":
                key = self._chat(body, session)
            else:
                key = self._completion(body, session)
        except (ValidationError, APIError) as e:
            raise ValueError(str(e)) from e
        model = body.get("model")
        key.lora_name = model if isinstance(model, str) and model in adapters else None
        return key

    def _chat(self, body: dict[str, Any], session: str | None) -> RequestKey:
        req = ChatCompletionRequest.model_validate(body)
        _, ids = render_chat_request(req, self.tokenizer, self.chat_template)
        n = req.n or 1
        return RequestKey(tuple(ids), len(ids) * n, n, req.cache_salt, session or req.user)

    def _completion(self, body: dict[str, Any], session: str | None) -> RequestKey:
        req = CompletionRequest.model_validate(body)
        prompts = [ids for _, ids in tokenize_prompts(req.prompt, self.tokenizer)]
        n = req.n or 1
        total = sum(len(p) for p in prompts) * n
        return RequestKey(
            tuple(prompts[0]), total, len(prompts) * n, req.cache_salt, session or req.user
        )
