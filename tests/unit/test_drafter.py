"""The drafter as the scheduler and engine core use it: drafts within the slots given and the
output constraint's valid prefix, a composite's lookup asked first, acceptance recorded by
source, per-request state kept off the Request and dropped when it finishes."""

from __future__ import annotations

from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams
from tokenmill.spec.drafter import Drafter
from tokenmill.spec.drafts import Drafts
from tokenmill.spec.proposer import LookupFirst


class Fixed:
    """Drafts a fixed list (cut to max_tokens), counting its calls."""

    needs_features = False
    scores_drafts = False

    def __init__(self, name: str, tokens: list[int]) -> None:
        self.name, self.tokens, self.calls = name, tokens, 0

    def draft(self, token_ids, state, max_tokens, min_chain_prob=0.0) -> Drafts:
        self.calls += 1
        return Drafts(self.tokens[:max_tokens])


class Scoring(Fixed):
    needs_features = True
    scores_drafts = True

    def draft(self, token_ids, state, max_tokens, min_chain_prob=0.0) -> Drafts:
        self.calls += 1
        assert state.feature is not None
        return Drafts(self.tokens[:max_tokens], [0.99] * min(max_tokens, len(self.tokens)))


def request(rid: str = "r") -> Request:
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=50), [], 128)


def everything(_request, drafts) -> int:
    return len(drafts)


def test_drafts_stay_within_the_slots_and_the_constraint_s_valid_prefix():
    main = Fixed("main", [5, 6, 7, 8])
    drafter = Drafter(main, adaptive=False, valid_prefix=lambda _r, d: min(len(d), 2))
    r = request()
    assert drafter.start_step([r]) > 0
    assert drafter.draft(r, 0) == [] and main.calls == 0  # no slot: not even asked
    assert drafter.draft(r, 3) == [5, 6]  # 3 slots, the constraint takes 2
    drafter.verified(r, 2, 1)
    assert drafter.stats.num_drafts == 1 and drafter.stats.num_accepted_tokens == 1
    assert drafter.stats.draft_tokens_by_proposer == {"main": 2}
    assert not hasattr(r, "spec_acceptance") and "r" in drafter.states
    drafter.finish("r")
    assert drafter.states == {}


def test_a_composite_asks_its_lookup_first_and_each_source_keeps_its_own_record():
    lookup, head = Fixed("ngram", [9, 9]), Fixed("draft_head", [4, 4, 4])
    drafter = Drafter(LookupFirst(lookup, head), adaptive=False, valid_prefix=everything)
    r = request()
    drafter.start_step([r])
    assert drafter.draft(r, 4) == [9, 9] and head.calls == 0
    drafter.verified(r, 2, 2)
    lookup.tokens = []  # nothing to copy: the head drafts
    assert drafter.draft(r, 4) == [4, 4, 4] and head.calls == 1
    drafter.verified(r, 3, 0)
    stats = drafter.stats
    assert stats.draft_tokens_by_proposer == {"ngram": 2, "draft_head": 3}
    assert stats.accepted_tokens_by_proposer == {"ngram": 2, "draft_head": 0}
    state = drafter.states["r"]
    assert state.acceptance["lookup"].rate() > state.acceptance["proposer"].rate()


def test_a_scoring_proposer_waits_for_the_target_s_hidden_state():
    import torch

    head = Scoring("draft_head", [3, 3, 3])
    drafter = Drafter(head, adaptive=False, valid_prefix=everything)
    r = request()
    drafter.start_step([r])
    assert drafter.draft(r, 3) == [] and head.calls == 0  # no feature yet
    drafter.update_features({"r": torch.ones(4)})
    assert drafter.draft(r, 3) == [3, 3, 3] and head.calls == 1
    assert drafter.states["r"].probs == [0.99] * 3  # calibrated once verified
    drafter.verified(r, 3, 3)
    assert drafter.states["r"].probs == [] and sum(drafter.policy.calibration.trials) > 0
