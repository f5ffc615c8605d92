"""Prompt text of a wanted token length.

With a server that has /tokenize + /detokenize (tokenmill and vLLM: {"prompt"} → {"tokens"},
{"tokens"} → {"prompt"}; llama-server: {"content"} → {"tokens"}, {"tokens"} → {"content"})
prompts are random token ids drawn uniformly from a pool of ordinary word tokens (the
server's tokenization of `words.WORDS`), detokenized, then re-tokenized and trimmed or
extended until the text is exactly the wanted length (up to a few rounds; the final count
is recorded). Without those endpoints: random words, roughly one token each (lengths are
then approximate; the server's usage reports the real counts).
"""

from __future__ import annotations

import random
from typing import Protocol

import httpx

from tokenmill.bench.words import WORDS


class PromptMaker(Protocol):
    kind: str

    async def make(self, rng: random.Random, n_tokens: int) -> tuple[str, int]:
        """Text of about n_tokens tokens and its measured (or estimated) token count."""
        ...


class WordPrompts:
    kind = "random-words"

    async def make(self, rng: random.Random, n_tokens: int) -> tuple[str, int]:
        return " ".join(rng.choice(WORDS) for _ in range(n_tokens)), n_tokens


class TokenPrompts:
    """Random token ids via the server's /tokenize and /detokenize."""

    kind = "random-token-ids"

    def __init__(self, client: httpx.AsyncClient, base_url: str, flavour: str, pool: list[int]):
        self.client = client
        self.base = base_url.rstrip("/")
        self.flavour = flavour  # "openai" (tokenmill, vLLM) or "llama" (llama-server)
        self.pool = pool

    @classmethod
    async def connect(cls, client: httpx.AsyncClient, base_url: str) -> TokenPrompts | None:
        """None when the server lacks usable tokenize/detokenize endpoints."""
        base = base_url.rstrip("/")
        text = " " + " ".join(WORDS)
        for flavour, body in (("openai", {"prompt": text}), ("llama", {"content": text})):
            try:
                r = await client.post(
                    f"{base}/tokenize", json={**body, "add_special_tokens": False}
                )
                tokens = r.json().get("tokens") if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                return None
            if tokens and all(isinstance(t, int) for t in tokens):
                maker = cls(client, base, flavour, sorted(set(tokens)))
                try:
                    await maker.detokenize(tokens[:4])
                except (httpx.HTTPError, ValueError, KeyError):
                    return None
                return maker
        return None

    async def tokenize(self, text: str) -> list[int]:
        key = "prompt" if self.flavour == "openai" else "content"
        r = await self.client.post(
            f"{self.base}/tokenize", json={key: text, "add_special_tokens": False}
        )
        r.raise_for_status()
        return list(r.json()["tokens"])

    async def detokenize(self, ids: list[int]) -> str:
        r = await self.client.post(f"{self.base}/detokenize", json={"tokens": ids})
        r.raise_for_status()
        body = r.json()
        return str(body["prompt"] if self.flavour == "openai" else body["content"])

    async def make(self, rng: random.Random, n_tokens: int) -> tuple[str, int]:
        ids = [rng.choice(self.pool) for _ in range(n_tokens)]
        text = await self.detokenize(ids)
        count = n_tokens
        for _ in range(4):
            got = await self.tokenize(text)
            count = len(got)
            if count == n_tokens:
                break
            if count > n_tokens:
                ids = got[:n_tokens]
            else:
                ids = got + [rng.choice(self.pool) for _ in range(n_tokens - count)]
            text = await self.detokenize(ids)
        return text, count


async def prompt_maker(client: httpx.AsyncClient, base_url: str, source: str) -> PromptMaker:
    """source: auto (token ids when the server allows, else words), tokens, words."""
    if source == "words":
        return WordPrompts()
    maker = await TokenPrompts.connect(client, base_url)
    if maker is None and source == "tokens":
        raise ValueError(f"prompt-source: {base_url} has no usable /tokenize + /detokenize")
    return maker or WordPrompts()
