"""Cost (tier credits, the engine's last-token rule), policies and the imbalance guard."""

from __future__ import annotations

import pytest

from tokenmill.router.config import CostWeights, GuardConfig, RouterConfig
from tokenmill.router.cost import candidate, overlap
from tokenmill.router.index import DEVICE, DISK, HOST
from tokenmill.router.policy import choose, imbalanced

W = CostWeights()


def cand(name, hit_tiers=(), pending=0.0, active=0, in_flight=0, tokens=160, w=W):
    return candidate(name, tokens, 16, list(hit_tiers), 0, pending, active, in_flight, w)


def test_overlap_credits_by_tier():
    assert overlap([DEVICE, HOST, DISK], 0, 10, W) == (3, 1.0 + 0.75 + 0.25)
    assert overlap([DEVICE | HOST], 0, 10, W) == (1, 1.0)  # best tier counts
    assert overlap([DISK], 3, 10, W) == (3, 3.0)  # the approximate index vouches as device
    assert overlap([DEVICE] * 10, 0, 9, W) == (9, 9.0)  # capped


def test_full_prompt_hit_still_computes_last_block():
    c = cand("a", [DEVICE] * 10, tokens=160)  # 160 tokens = exactly 10 blocks
    assert c.hit_blocks == 9 and c.new_prefill == pytest.approx(1.0)


def test_cost_formula():
    w = CostWeights(prefill=2.0, decode=0.5)
    c = cand("a", [DEVICE] * 4, pending=3.0, active=20, tokens=100, w=w)
    assert c.prompt_blocks == pytest.approx(6.25)
    assert c.cost == pytest.approx(2.0 * (3.0 + 2.25) + 0.5 * 20)


def test_weights_validated():
    with pytest.raises(ValueError, match="decode"):
        CostWeights(decode=-1)
    with pytest.raises(ValueError, match="policy"):
        RouterConfig(policy="random")


def test_cache_aware_prefers_the_cached_replica():
    a, b = cand("a", [DEVICE] * 8), cand("b")
    chosen, reason = choose("cache_aware", [a, b], GuardConfig(), turn=0)
    assert chosen.replica == "a" and reason == "cache_hit"


def test_host_tier_hit_beats_cold_but_loses_to_device():
    dev, host, cold = cand("d", [DEVICE] * 8), cand("h", [HOST] * 8), cand("c")
    assert choose("cache_aware", [cold, host], GuardConfig(), 0)[0].replica == "h"
    assert choose("cache_aware", [host, dev], GuardConfig(), 0)[0].replica == "d"


def test_load_outweighs_a_small_hit():
    busy = cand("a", [DEVICE] * 2, pending=40.0)  # lots of booked prefill
    idle = cand("b")
    chosen, reason = choose("cache_aware", [busy, idle], GuardConfig(), 0)
    assert chosen.replica == "b" and reason == "load"


def test_ties_rotate():
    cands = [cand("a"), cand("b")]
    picks = {choose("cache_aware", cands, GuardConfig(), t)[0].replica for t in range(4)}
    assert picks == {"a", "b"}


def test_imbalance_guard():
    g = GuardConfig(abs_threshold=4, rel_threshold=1.5)
    hot = cand("a", [DEVICE] * 9, in_flight=10)
    cold = cand("b", in_flight=2)
    assert imbalanced([hot, cold], g)
    chosen, reason = choose("cache_aware", [hot, cold], g, 0)
    assert chosen.replica == "b" and reason == "imbalance_guard"
    # either condition alone does not trigger
    assert not imbalanced([cand("a", in_flight=5), cand("b", in_flight=2)], g)  # diff 3
    assert not imbalanced([cand("a", in_flight=14), cand("b", in_flight=10)], g)  # ratio 1.4
    assert choose("cache_aware", [hot, cand("b", in_flight=8)], g, 0)[0].replica == "a"


def test_round_robin_and_least_load():
    cands = [cand("a", in_flight=3), cand("b", in_flight=1), cand("c", in_flight=2)]
    assert [choose("round_robin", cands, GuardConfig(), t)[0].replica for t in range(4)] == [
        "a", "b", "c", "a",
    ]  # fmt: skip
    assert choose("least_load", cands, GuardConfig(), 0) == (cands[1], "least_load")


def test_session_is_sticky_and_moves_only_its_own_sessions():
    cands = [cand("a"), cand("b"), cand("c")]
    placed = {f"user-{i}": choose("session", cands, GuardConfig(), i, f"user-{i}")[0].replica
              for i in range(60)}  # fmt: skip
    assert set(placed.values()) == {"a", "b", "c"}
    for i in range(60):  # same answer whatever the turn
        assert (
            choose("session", cands, GuardConfig(), 99, f"user-{i}")[0].replica
            == placed[f"user-{i}"]
        )
    without_c = [cands[0], cands[1]]
    for s, r in placed.items():
        if r != "c":
            assert choose("session", without_c, GuardConfig(), 0, s)[0].replica == r
    assert choose("session", cands, GuardConfig(), 0, None)[1] == "session_fallback"
