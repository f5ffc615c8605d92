"""Loop cut-off: detect an exact cycle in the generated tail, incrementally.

runs[p] counts how many consecutive latest tokens equal the token p positions earlier; when
runs[p] >= p * (min_repeats - 1), the last runs[p] + p tokens are min_repeats (or more)
copies of one p-token cycle. O(max_period) per token.
"""

from __future__ import annotations

from tokenmill.sampling_params import RepetitionDetection


class RepetitionDetector:
    def __init__(self, config: RepetitionDetection) -> None:
        self.config = config
        self.runs = [0] * (config.max_period + 1)

    def reset(self) -> None:
        self.runs = [0] * (self.config.max_period + 1)

    def update(self, tokens: list[int]) -> int | None:
        """Call after each appended token; returns the cycle period once the tail loops."""
        n = len(tokens)
        last = tokens[-1]
        cfg = self.config
        found = None
        for p in range(1, min(cfg.max_period, n - 1) + 1):
            if tokens[n - 1 - p] == last:
                self.runs[p] += 1
                r = self.runs[p]
                if found is None and r >= p * (cfg.min_repeats - 1) and r + p >= cfg.min_span:
                    found = p
            else:
                self.runs[p] = 0
        return found
