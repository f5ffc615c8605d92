"""The n-gram index a request being decoded keeps for prompt lookup (ngram.py): every
n-gram's latest position, extended by the tokens appended since the last step, so a lookup
costs a few dictionary reads whatever the sequence's length."""

from __future__ import annotations

from collections.abc import Sequence

# Only the most recent tokens are searched: bounds the cost per step on long sequences.
MAX_SEARCH_TOKENS = 8192


class NgramIndex:
    """For one growing token sequence: the end position of the latest occurrence of every
    n-gram (min_n <= n <= max_n) that has a token after it, from position `base` on. Built
    over the last MAX_SEARCH_TOKENS tokens and rebuilt so once it spans twice that: at most
    ~2 * MAX_SEARCH_TOKENS entries per n."""

    __slots__ = ("min_n", "max_n", "tables", "base", "upto")

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tables: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_n, max_n + 1)
        }
        self.base = 0
        self.upto = 0  # tokens indexed

    def update(self, tokens: Sequence[int]) -> None:
        length = len(tokens)
        if self.upto == 0 or length < self.upto or length - self.base > 2 * MAX_SEARCH_TOKENS:
            # first call, shorter than indexed (another sequence) or too long: (re)build
            self.base = self.upto = max(0, length - MAX_SEARCH_TOKENS)
            for table in self.tables.values():
                table.clear()
        # token i is the follower of the n-grams that end at i - 1
        for i in range(max(self.upto, self.base + 1), length):
            for n, table in self.tables.items():
                if i - n < self.base:
                    break
                table[tuple(tokens[i - n : i])] = i - 1
        self.upto = length

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """NgramProposer.propose's drafts (the same tokens as its scan), from the index."""
        self.update(tokens)
        length = len(tokens)
        window = max(0, length - MAX_SEARCH_TOKENS)
        for n in range(min(self.max_n, length - window - 1), self.min_n - 1, -1):
            end = self.tables[n].get(tuple(tokens[length - n :]))
            if end is not None and end - n + 1 >= window:
                return list(tokens[end + 1 : end + 1 + k])
        return []
