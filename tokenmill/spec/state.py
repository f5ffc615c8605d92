"""A request's speculation state, kept by the drafter (never on the Request): how its
drafts fared lately per source, where the drafts in flight came from, and what the
proposers keep per sequence (the target's last hidden state, an n-gram index)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tokenmill.spec.draft_policy import DRAFT_SOURCES, Acceptance
from tokenmill.spec.ngram_index import NgramIndex


@dataclass
class SpecState:
    # recent acceptance of its drafts per source: its proposer, a composite's lookup first
    acceptance: dict[str, Acceptance] = field(
        default_factory=lambda: {source: Acceptance() for source in DRAFT_SOURCES}
    )
    source: str = "proposer"  # where the drafts being verified came from
    probs: list[float] = field(default_factory=list)  # a scoring proposer's, for those drafts
    feature: torch.Tensor | None = None  # the target's last hidden state (draft heads)
    ngram_index: NgramIndex | None = None  # n-gram lookup's, over the request's tokens
