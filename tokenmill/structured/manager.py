"""Structured output for the engine core (vLLM's StructuredOutputManager): the grammar
compiler (built on first use), each constrained request's matcher, the drafts a request's
grammar allows, and the tokens that close a document (what the sampler prefers while a
constrained output is being closed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from tokenmill.sampling_params import SamplingParams
from tokenmill.structured.closing import char_tokens, token_starts
from tokenmill.structured.grammar import GrammarCompiler

if TYPE_CHECKING:
    from tokenmill.model.tokenizer import Tokenizer


class Constrained(Protocol):
    """A request as structured output sees it (tokenmill.request.Request)."""

    grammar: object | None


@dataclass(frozen=True)
class ClosingTokens:
    """What closing a constrained output prefers: by first character, the tokens that
    start with it; single-character tokens; the end-of-sequence ids; and a decoder."""

    closers: dict[str, torch.Tensor]
    char_tokens: dict[str, int]
    eos_ids: torch.Tensor
    decode: object  # Callable[[list[int]], str]


class StructuredOutputManager:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._compiler: GrammarCompiler | None = None
        self.closing: ClosingTokens | None = None  # set with the compiler

    @property
    def compiler(self) -> GrammarCompiler:
        """Built on first use (the llguidance tokenizer takes a fraction of a second), with
        the closing tokens the sampler needs once constrained requests exist."""
        if self._compiler is None:
            self._compiler = GrammarCompiler(self.tokenizer, self.vocab_size)
            tok = self.tokenizer
            n = min(self.vocab_size, tok.vocab_size)
            texts = [tok.decode([t], skip_special_tokens=False) for t in range(n)]
            eos = [t for t in tok.eos_token_ids if t < self.vocab_size]
            self.closing = ClosingTokens(
                token_starts(texts), char_tokens(texts), torch.tensor(eos), tok.decode
            )
        return self._compiler

    def init_request(self, request: Constrained, params: SamplingParams) -> None:
        """The request's grammar matcher, when its output is constrained."""
        if params.structured_outputs is not None:
            request.grammar = self.compiler.matcher(params.structured_outputs)

    @staticmethod
    def valid_prefix(request: Constrained, tokens: list[int]) -> int:
        """How many of `tokens` (drafts) the request's grammar accepts in a row."""
        if request.grammar is None or not tokens:
            return len(tokens)
        return request.grammar.validate_tokens(tokens)
