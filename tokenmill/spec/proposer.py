"""The proposer interface: given a sequence's tokens, draft the next few."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenmill.config import SpeculativeConfig


class Proposer(Protocol):
    name: str

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` drafted continuations of `token_ids` (may be none)."""
        ...


def build_proposer(config: SpeculativeConfig) -> Proposer:
    if config.method == "ngram":
        from tokenmill.spec.ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max, config.num_speculative_tokens)
    raise ValueError(f"speculative method: unknown {config.method!r}")
