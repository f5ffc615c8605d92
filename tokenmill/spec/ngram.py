"""N-gram prompt lookup (vLLM's `ngram`, llama.cpp's lookup decoding): the sequence's last n
tokens are searched earlier in the prompt and output; the tokens that followed their most
recent earlier occurrence are the drafts. Longer n-grams are tried first.

A request being decoded keeps an NgramIndex: every n-gram's latest position, extended by the
tokens appended since the last step, so a lookup costs a few dictionary reads whatever the
sequence's length (a scan over the history took ~0.2 ms a request and step at 8k tokens)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tokenmill.spec.drafts import Drafts
from tokenmill.spec.ngram_index import MAX_SEARCH_TOKENS, NgramIndex
from tokenmill.spec.state import SpecState


class NgramProposer:
    name = "ngram"
    needs_features = False
    scores_drafts = False

    def __init__(self, min_n: int, max_n: int, k: int) -> None:
        self.min_n, self.max_n, self.k = min_n, max_n, k

    def new_index(self) -> NgramIndex:
        return NgramIndex(self.min_n, self.max_n)

    def propose(
        self, token_ids: Sequence[int], max_tokens: int, index: NgramIndex | None = None
    ) -> list[int]:
        """Drafts after token_ids; `index`: the sequence's NgramIndex (kept by the caller
        across steps), else the history is scanned."""
        k = min(self.k, max_tokens)
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        if index is not None:
            return index.propose(token_ids, k)
        tokens = np.asarray(token_ids[-MAX_SEARCH_TOKENS:], dtype=np.int64)
        # an earlier occurrence ends where the last token occurs again (not at the very end:
        # at least one token follows it); only those ends are compared further back
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            room = ends[ends >= n - 1]  # n tokens fit before the end
            spans = tokens[room[:, None] - np.arange(n - 1, -1, -1)]  # [ends, n]
            hits = room[(spans == tokens[-n:]).all(axis=1)]
            if hits.size:
                start = int(hits[-1]) + 1  # after the most recent earlier occurrence
                return tokens[start : start + k].tolist()
        return []

    def draft(
        self, token_ids: Sequence[int], state: SpecState, max_tokens: int,
        min_chain_prob: float = 0.0,
    ) -> Drafts:  # fmt: skip
        """The Proposer protocol: drafts from the request's index (made on first use)."""
        if state.ngram_index is None:
            state.ngram_index = self.new_index()
        return Drafts(self.propose(token_ids, max_tokens, index=state.ngram_index))
