"""A proposer's answer: drafted tokens and, from one that scores them, its probability of
each (the draft policy then sizes the chain by those: DraftPolicy.num_scored_drafts)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Drafts:
    token_ids: list[int] = field(default_factory=list)
    probs: list[float] | None = None
