"""The proposer interface: given a sequence's tokens, draft the next few."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tokenmill.config import SpeculativeConfig


class Proposer(Protocol):
    name: str

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` drafted continuations of `token_ids` (may be none). A proposer
        with `needs_features = True` also gets `feature=`: the target's last hidden state. One
        with a `lookup` proposer (not None) is asked only where that one drafts nothing. One
        with `scores_drafts = True` is asked through `propose_scored(token_ids, max_tokens,
        feature, min_chain_prob)` instead: (drafts, its probability of each), so the draft
        policy sizes the chain by those (DraftPolicy.num_scored_drafts)."""
        ...


def build_proposer(config: SpeculativeConfig, model) -> Proposer:
    if config.method == "ngram":
        from tokenmill.spec.ngram import NgramProposer

        return NgramProposer(config.ngram_min, config.ngram_max, config.num_speculative_tokens)
    if config.method == "draft_head":
        from tokenmill.spec.draft_proposer import DraftHeadProposer
        from tokenmill.spec.ngram import NgramProposer

        assert config.speculator is not None
        proposer = DraftHeadProposer.from_file(
            config.speculator, model, config.num_speculative_tokens
        )
        if config.lookup_first:
            k = config.num_speculative_tokens
            proposer.lookup = NgramProposer(config.ngram_min, config.ngram_max, k)
        return proposer
    raise ValueError(f"speculative method: unknown {config.method!r}")
