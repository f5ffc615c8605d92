"""Token ids and block hashes of a trace's prompts, made as the trace plays: a session's
history is its previous prompt and reply, hashed once and extended (the engine's chained
hash, so the router and the replicas see exactly the engine's hashes)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tokenmill.kv.hashing import BlockHash, block_hashes
from tokenmill.router.sim.trace import Trace, TraceRequest

FIRST_ID = 100  # token ids below are left to special tokens


def token_ids(seed: int, vocab: int, n: int, *stream: int) -> list[int]:
    rng = np.random.default_rng([seed, *stream])
    return rng.integers(FIRST_ID, vocab, size=n).tolist()


@dataclass
class Prompt:
    token_ids: list[int]
    hashes: list[BlockHash]  # of its full blocks


class Conversations:
    def __init__(self, trace: Trace, block_size: int = 16) -> None:
        self.trace = trace
        self.block_size = block_size
        self._history: dict[int, Prompt] = {}  # session -> prompt + reply so far
        self._system: dict[int, Prompt] = {}

    def system(self, family: int) -> Prompt:
        p = self._system.get(family)
        if p is None:
            n = self.trace.system_tokens[family]
            ids = token_ids(self.trace.seed, self.trace.vocab, n, 0, family)
            p = self._system[family] = Prompt(ids, block_hashes(ids, self.block_size))
        return p

    def prompt(self, r: TraceRequest) -> Prompt:
        before = self._history.get(r.session) or self.system(r.family)
        ids = before.token_ids + token_ids(
            self.trace.seed, self.trace.vocab, r.user_tokens, 1, r.session, r.turn
        )
        return Prompt(ids, block_hashes(ids, self.block_size, None, before.hashes))

    def reply(self, r: TraceRequest) -> list[int]:
        return token_ids(self.trace.seed, self.trace.vocab, r.output_tokens, 2, r.session, r.turn)

    def finished(self, r: TraceRequest, prompt: Prompt) -> None:
        """The turn's reply is complete: the next turn starts from prompt + reply."""
        ids = prompt.token_ids + self.reply(r)
        self._history[r.session] = Prompt(
            ids, block_hashes(ids, self.block_size, None, prompt.hashes)
        )

    def end(self, session: int) -> None:
        self._history.pop(session, None)
