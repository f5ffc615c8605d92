"""Proposers draft the next few tokens of a sequence. The Proposer protocol is what the
drafter (drafter.py) asks of one; LookupFirst makes one proposer of a free n-gram lookup
tried before another (a draft head)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tokenmill.config import SpeculativeConfig
from tokenmill.spec.drafts import Drafts
from tokenmill.spec.state import SpecState


class Proposer(Protocol):
    name: str  # in the speculation metrics' `proposer` label
    needs_features: bool  # drafts from the target's last hidden state (SpecState.feature)
    scores_drafts: bool  # Drafts.probs are given

    def draft(
        self,
        token_ids: Sequence[int],
        state: SpecState,
        max_tokens: int,
        min_chain_prob: float = 0.0,
    ) -> Drafts:
        """Up to `max_tokens` drafted continuations of `token_ids` (may be none). A scoring
        proposer stops its chain before the product of its probabilities falls below
        `min_chain_prob`."""
        ...


@dataclass
class LookupFirst:
    """`lookup` is asked first (free: where the sequence repeats itself its drafts are long
    and mostly right); `main` only where it drafts nothing that pays. Each keeps its own
    acceptance estimates (sources "lookup" and "proposer")."""

    lookup: Proposer
    main: Proposer

    @property
    def name(self) -> str:
        return self.main.name

    @property
    def needs_features(self) -> bool:
        return self.main.needs_features

    @property
    def scores_drafts(self) -> bool:
        return self.main.scores_drafts

    def draft(
        self, token_ids: Sequence[int], state: SpecState, max_tokens: int,
        min_chain_prob: float = 0.0,
    ) -> Drafts:  # fmt: skip
        return self.main.draft(token_ids, state, max_tokens, min_chain_prob)


def build_proposer(config: SpeculativeConfig, model) -> Proposer:
    from tokenmill.spec.ngram import NgramProposer

    k = config.num_speculative_tokens
    if config.method == "ngram":
        return NgramProposer(config.ngram_min, config.ngram_max, k)
    if config.method == "draft_head":
        from tokenmill.spec.draft_proposer import DraftHeadProposer

        assert config.speculator is not None
        head = DraftHeadProposer.from_file(config.speculator, model, k)
        if config.lookup_first:
            return LookupFirst(NgramProposer(config.ngram_min, config.ngram_max, k), head)
        return head
    raise ValueError(f"speculative method: unknown {config.method!r}")
