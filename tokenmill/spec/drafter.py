"""Speculative decoding as one component of the engine core: the proposer, the draft
policy that sizes each request's drafts from measured costs and acceptance, each request's
speculation state and the statistics. The scheduler asks it for a decoding request's drafts
(within the slots the scheduler can give) and tells it how many were accepted; the engine
core gives it each step's time and the target's hidden states."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from tokenmill.config import MAX_SPEC_ROWS
from tokenmill.request import Request
from tokenmill.spec.draft_policy import DraftPolicy, StepTimes
from tokenmill.spec.proposer import LookupFirst, Proposer
from tokenmill.spec.state import SpecState
from tokenmill.stats import SpecDecodeStats

# how many of a request's drafts its output constraint accepts in a row
ValidPrefix = Callable[[Request, list[int]], int]


class Drafter:
    def __init__(self, proposer: Proposer, adaptive: bool, valid_prefix: ValidPrefix) -> None:
        self.proposer = proposer
        self.step_times = StepTimes()  # decode-only step seconds by rows (the engine measures)
        self.policy = DraftPolicy(self.step_times, adaptive)
        self.valid_prefix = valid_prefix
        self.stats = SpecDecodeStats()
        self.states: dict[str, SpecState] = {}

    @property
    def needs_features(self) -> bool:
        """The model runner keeps each request's last hidden state for the proposer."""
        return self.proposer.needs_features

    def _stages(self) -> tuple[Proposer | None, Proposer]:
        p = self.proposer
        return (p.lookup, p.main) if isinstance(p, LookupFirst) else (None, p)

    def _state(self, request_id: str) -> SpecState:
        state = self.states.get(request_id)
        if state is None:
            state = self.states[request_id] = SpecState()
        return state

    # ------------------------------------------------------------ the scheduler's calls

    def start_step(self, decoding: Sequence[Request]) -> int:
        """A new step with these decoding requests: the draft rows it has room for (drafts
        go to decoding requests while the step's decode rows fit MAX_SPEC_ROWS)."""
        self.policy.start_step(len(decoding), sum(r.num_tokens for r in decoding))
        return MAX_SPEC_ROWS - len(decoding)

    def draft(self, request: Request, slots: int) -> list[int]:
        """Drafts for a decoding request, at most `slots` (what its lengths and output
        constraint leave), cut at the first one its constraint rejects, as many as pay."""
        if slots <= 0:
            return []
        state = self._state(request.request_id)
        lookup, main = self._stages()
        if lookup is not None:  # free to ask: where the sequence repeats itself, copy it
            found = self._timed(lookup, "lookup", request, state, slots)
            drafts = self._paying(request, state, "lookup", found)
            if drafts:
                return drafts
        policy = self.policy
        own = state.acceptance["proposer"]
        # a scoring proposer's drafts are sized by their own probabilities (after drafting):
        # before, only whether its most confident drafts would pay
        rate = policy.calibration.best_rate() if main.scores_drafts else policy.acceptance(own)
        room = policy.num_drafts(rate, slots, policy.draft_costs["proposer"].per_draft())
        if room <= 0:  # no drafting where none would pay
            policy.idle(own)
            policy.draft_costs["proposer"].idle()
            if main.scores_drafts:
                policy.calibration.idle()
            return []
        if main.scores_drafts:
            return self._scored(main, request, state, room)
        drafts = self._timed(main, "proposer", request, state, room)
        return self._paying(request, state, "proposer", drafts)

    def verified(self, request: Request, drafted: int, accepted: int) -> None:
        """`accepted` of the request's `drafted` drafts were the target's own tokens."""
        state = self._state(request.request_id)
        source = state.source
        lookup, main = self._stages()
        proposer = lookup if source == "lookup" and lookup is not None else main
        if source == "proposer" and state.probs:
            self.policy.calibration.record(state.probs, accepted)
            state.probs = []
        self.stats.record(drafted, accepted, proposer.name)
        self.policy.record(state.acceptance[source], drafted, accepted, source)

    def finish(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    # ------------------------------------------------------------ the engine core's calls

    def update_features(self, features: dict[str, torch.Tensor]) -> None:
        """The target's last hidden state of each request that sampled this step."""
        for request_id, feature in features.items():
            self._state(request_id).feature = feature

    def observe_step(self, num_tokens: int, seconds: float, context_tokens: int) -> None:
        """A decode-only step's time; drafting is left out (it is priced per draft)."""
        self.step_times.observe(num_tokens, seconds - self.policy.drafting, context_tokens)

    # ------------------------------------------------------------ sizing

    def _timed(
        self, proposer: Proposer, source: str, request: Request, state: SpecState, room: int
    ) -> list[int]:
        """A proposer's drafts; the time they took is the policy's cost per draft of the
        source, and is left out of the step time by row count."""
        start = time.perf_counter()
        drafts = proposer.draft(request.all_token_ids, state, room).token_ids
        self.policy.drafted(source, len(drafts), time.perf_counter() - start)
        return drafts

    def _within(self, request: Request, drafts: list[int]) -> list[int]:
        return drafts[: self.valid_prefix(request, drafts)] if drafts else drafts

    def _paying(
        self, request: Request, state: SpecState, source: str, drafts: list[int]
    ) -> list[int]:
        """The drafts up to the first one the output constraint rejects, and of those as
        many as pay at the source's acceptance; the state remembers where they came from."""
        drafts = self._within(request, drafts)
        acceptance = state.acceptance[source]
        rate = self.policy.acceptance(acceptance, source)
        k = self.policy.num_drafts(rate, len(drafts))
        if k:
            self.policy.commit(rate, k)
            state.source = source
        elif drafts and source == "lookup":
            self.policy.idle(acceptance, source)  # declined: its estimate drifts back
        return drafts[:k]

    def _scored(self, main: Proposer, request: Request, state: SpecState, room: int) -> list[int]:
        """A scoring proposer's chain, stopped where it gets too unlikely to pay for a row,
        cut at the first draft the constraint rejects, then sized by the drafts'
        calibrated probabilities."""
        policy = self.policy
        if main.needs_features and state.feature is None:  # nothing to draft from yet
            return []
        start = time.perf_counter()
        found = main.draft(request.all_token_ids, state, room, policy.min_chain_prob())
        # a chain stopped before its first draft still ran the proposer once
        policy.drafted("proposer", max(len(found.token_ids), 1), time.perf_counter() - start)
        drafts = self._within(request, found.token_ids)
        probs = found.probs or []
        k = policy.num_scored_drafts(probs[: len(drafts)])
        if k:
            policy.commit_scored(probs, k)
            state.source = "proposer"
            state.probs = probs[:k]
        else:
            policy.idle(state.acceptance["proposer"])
        return drafts[:k]
