"""Metric math against hand-computed values (vLLM `bench serve` definitions)."""

from __future__ import annotations

import math

import pytest

from tests.bench.fixtures import REC_A, REC_B, REC_C, REC_D
from tokenmill.bench.config import SLO
from tokenmill.bench.metrics import Stats, itl_gaps_s, meets_slo, summarize, tpot_s

approx = pytest.approx


def test_per_request_single_token_chunks():
    assert REC_A.ttft_s == approx(0.5)
    assert REC_A.latency_s == approx(1.0)
    assert tpot_s(REC_A) == approx(0.5 / 3)
    assert itl_gaps_s(REC_A) == approx([0.1, 0.2, 0.2])


def test_multi_token_chunk_gives_k_equal_gaps():
    assert REC_B.ttft_s == approx(0.2)
    assert tpot_s(REC_B) == approx(0.2)
    assert itl_gaps_s(REC_B) == approx([0.1, 0.1, 0.1, 0.3, 0.3])
    # gaps sum to the time from first to last token, one gap per token after the first
    assert sum(itl_gaps_s(REC_B)) == approx(2.1 - 1.2)
    assert len(itl_gaps_s(REC_B)) == REC_B.num_output_tokens - 1


def test_single_token_request_has_no_tpot():
    assert tpot_s(REC_D) is None
    assert itl_gaps_s(REC_D) == []
    assert meets_slo(REC_D, SLO(tpot_ms=1.0))  # counts as TPOT 0, as vLLM


def test_summary_throughput_errors_and_cache():
    s = summarize([REC_A, REC_B, REC_C])
    assert (s.num_requests, s.completed, s.failed) == (3, 2, 1)
    assert s.error_rate == approx(1 / 3)
    assert s.errors == {"HTTP 503": 1}
    assert s.duration_s == approx(3.0)  # last response, failed ones included
    assert s.request_throughput == approx(2 / 3.0)
    assert s.total_output_tokens == 10
    assert s.output_throughput == approx(10 / 3.0)
    assert s.total_input_tokens == 30
    assert s.total_throughput == approx(40 / 3.0)
    assert s.cached_tokens == 4
    assert s.cache_hit_rate == approx(4 / 30)
    assert s.mean_concurrency == approx((1.0 + 1.2 + 2.5) / 3.0)
    assert s.per_user_output_throughput == approx((6.0 + 5.0) / 2)
    assert s.goodput is None and s.slo_attainment is None


def test_failed_requests_are_excluded_from_latency_stats():
    s = summarize([REC_A, REC_B, REC_C])
    assert s.ttft_ms.count == 2
    assert s.ttft_ms.mean == approx(350.0)
    assert s.ttft_ms.median == approx(350.0)
    assert s.ttft_ms.std == approx(150.0)  # population std, as numpy / vLLM
    assert s.ttft_ms.p99 == approx(200.0 + 0.99 * 300.0)
    assert s.e2e_ms.mean == approx(1100.0)
    assert s.tpot_ms.mean == approx((500.0 / 3 + 200.0) / 2)
    assert s.itl_ms.count == 8
    assert s.itl_ms.mean == approx(1400.0 / 8)
    assert s.itl_ms.median == approx(150.0)
    assert s.schedule_delay_ms.max == approx(300.0)


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        ("ttft=300ms,tpot=180ms", 0),  # A misses TTFT, B misses TPOT
        ("ttft=600ms,tpot=250ms", 2),
        ("e2el=1100ms", 1),  # A 1000 ms meets, B 1200 ms doesn't
        ("ttft=0.25s", 1),
        ("itl=250", 1),  # max gap: A 200 ms, B 300 ms
    ],
)
def test_goodput(slo, good):
    s = summarize([REC_A, REC_B, REC_C], SLO.parse(slo))
    assert s.goodput == approx(good / 3.0)
    assert s.slo_attainment == approx(good / 3)


def test_slo_parse():
    assert SLO.parse("ttft=500ms,tpot=50ms") == SLO(ttft_ms=500.0, tpot_ms=50.0)
    assert SLO.parse("e2el=2s itl:20") == SLO(e2e_ms=2000.0, itl_ms=20.0)
    assert SLO.parse(None).empty
    with pytest.raises(ValueError, match="slo"):
        SLO.parse("latency=5")


def test_empty_and_all_failed():
    s = summarize([REC_C])
    assert s.completed == 0 and s.failed == 1 and s.error_rate == 1.0
    assert math.isnan(s.ttft_ms.mean) and s.ttft_ms.count == 0
    assert Stats.of([]).count == 0
    assert summarize([]).num_requests == 0
