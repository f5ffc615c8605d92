"""N-gram prompt lookup (vLLM's `ngram`, llama.cpp's lookup decoding): the sequence's last n
tokens are searched earlier in the prompt and output; the tokens that followed their most
recent earlier occurrence are the drafts. Longer n-grams are tried first."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Only the most recent tokens are searched: bounds the cost per step on long sequences.
MAX_SEARCH_TOKENS = 8192


class NgramProposer:
    name = "ngram"

    def __init__(self, min_n: int, max_n: int, k: int) -> None:
        self.min_n, self.max_n, self.k = min_n, max_n, k

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        k = min(self.k, max_tokens)
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
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
