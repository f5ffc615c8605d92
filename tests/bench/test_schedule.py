"""Arrival schedules (seeded) and the async scheduler's load discipline."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.bench.fakes import FakeServer
from tokenmill.bench.config import LoadSpec
from tokenmill.bench.lengths import LengthDist
from tokenmill.bench.runner import planned_offsets, run_load
from tokenmill.bench.schedule import constant_arrivals, poisson_arrivals, trace_arrivals
from tokenmill.bench.sweep import sweep_rates
from tokenmill.bench.workloads import Session, Turn, Workload


def workload(n: int, turns: int = 1) -> Workload:
    t = tuple(Turn(f"hello {i}", 2, 4) for i in range(turns))
    return Workload("w", tuple(Session(i, t) for i in range(n)), "fake")


def test_constant_rate_is_exact():
    assert constant_arrivals(4, 2.0) == [0.0, 0.5, 1.0, 1.5]
    assert constant_arrivals(3, float("inf")) == [0.0, 0.0, 0.0]


def test_poisson_is_seeded_and_has_the_mean_rate():
    a = poisson_arrivals(20_000, 5.0, seed=7)
    assert a == poisson_arrivals(20_000, 5.0, seed=7)
    assert a != poisson_arrivals(20_000, 5.0, seed=8)
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:], strict=False))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1


@pytest.mark.parametrize(("burstiness", "cv"), [(0.25, 2.0), (4.0, 0.5)])
def test_burstiness_is_the_gamma_shape(burstiness, cv):
    gaps = np.diff(poisson_arrivals(40_000, 10.0, burstiness, seed=1))
    assert gaps.mean() == pytest.approx(0.1, rel=0.04)  # the rate is kept
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.06)  # CV = 1/sqrt(shape)


def test_trace_arrivals_shift_and_speedup():
    assert trace_arrivals([10.0, 11.0, 14.0], speedup=2.0) == [0.0, 0.5, 2.0]


def test_planned_offsets_follow_the_load():
    sessions = workload(3).sessions
    assert planned_offsets(sessions, LoadSpec("constant", rate=4.0), 0) == [0.0, 0.25, 0.5]
    assert planned_offsets(sessions, LoadSpec("throughput"), 0) == [0.0] * 3
    with pytest.raises(ValueError, match="trace"):
        planned_offsets(sessions, LoadSpec("trace"), 0)


def test_sweep_rates_lie_between_sync_and_saturation():
    assert sweep_rates(1.0, 5.0, 3) == pytest.approx([2.0, 3.0, 4.0])
    assert sweep_rates(1.0, 0.9, 3) == []


def test_length_distributions():
    import random

    rng = random.Random(0)
    assert LengthDist.parse("128").sample(rng, 3) == [128, 128, 128]
    u = LengthDist.parse("uniform:10-20").sample(rng, 500)
    assert min(u) >= 10 and max(u) <= 20 and len(set(u)) == 11
    n = LengthDist.parse("normal:100,10").sample(rng, 2000)
    assert np.mean(n) == pytest.approx(100, rel=0.02) and min(n) >= 1
    with pytest.raises(ValueError, match="length"):
        LengthDist.parse("gauss:1")


def test_load_spec_validation():
    with pytest.raises(ValueError, match="rate"):
        LoadSpec("poisson")
    with pytest.raises(ValueError, match="concurrency"):
        LoadSpec("concurrency", concurrency=0)
    assert LoadSpec("poisson", rate=2, burstiness=0.5).label == "2 req/s poisson b=0.5"


def test_closed_loop_concurrency():
    server = FakeServer(service_s=0.03)
    recs = asyncio.run(run_load(workload(10), LoadSpec("concurrency", concurrency=3), server))
    assert len(recs) == 10 and all(r.success for r in recs)
    assert server.max_in_flight == 3


def test_concurrency_cap_on_open_loop_and_its_delay_is_recorded():
    server = FakeServer(service_s=0.05)
    load = LoadSpec("throughput", max_concurrency=3)
    recs = asyncio.run(run_load(workload(9), load, server))
    assert server.max_in_flight == 3
    delays = sorted(r.schedule_delay_s for r in recs)
    assert delays[0] < 0.02 and delays[-1] > 0.09  # the last three waited two rounds


def test_open_loop_sends_on_schedule_whatever_the_responses_do():
    """Slow responses (0.5 s) must not delay sends planned every 50 ms."""
    server = FakeServer(service_s=0.5)
    recs = asyncio.run(run_load(workload(8), LoadSpec("constant", rate=20.0), server))
    starts = sorted(r.start_s for r in recs)
    assert starts == pytest.approx([i * 0.05 for i in range(8)], abs=0.03)
    assert server.max_in_flight == 8
    assert max(r.schedule_delay_s for r in recs) < 0.03


def test_max_duration_stops_sending():
    server = FakeServer(service_s=0.01)
    recs = asyncio.run(
        run_load(workload(20), LoadSpec("constant", rate=10.0), server, max_duration_s=0.35)
    )
    assert 3 <= len(recs) <= 5
