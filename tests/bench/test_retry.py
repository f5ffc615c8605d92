"""Busy runs are rerun on fresh prompts; the attempt with the least background CPU stays."""

from __future__ import annotations

import asyncio

from tests.bench.fixtures import REC_A
from tokenmill.bench import execute
from tokenmill.bench.config import LoadSpec, Target
from tokenmill.bench.execute import RunOptions, run_target
from tokenmill.bench.metrics import summarize
from tokenmill.bench.results import RunResult
from tokenmill.bench.workloads import Workload


def run(monkeypatch, backgrounds: list[float], retry_busy: int):
    calls: list[str] = []
    rebuilt: list[tuple[int, int]] = []

    async def fake_run_once(client, target, model, workload, load, options, console, stage):
        calls.append(workload.name)
        bg = backgrounds[len(calls) - 1]
        return RunResult(target.name, workload.name, load, summarize([REC_A]), (REC_A,), stage, bg)

    async def rebuild(i: int, attempt: int) -> Workload:
        rebuilt.append((i, attempt))
        return Workload(f"fresh-{attempt}", (), "fake")

    async def no_model(client, target):
        return None

    monkeypatch.setattr(execute, "run_once", fake_run_once)
    monkeypatch.setattr(execute, "resolve_model", no_model)
    results = asyncio.run(
        run_target(
            Target("t", "http://unused"),
            [(Workload("first", (), "fake"), LoadSpec("concurrency", concurrency=1))],
            RunOptions(warmup=0, retry_busy=retry_busy),
            rebuild=rebuild,
        )
    )
    return results, calls, rebuilt


def test_busy_run_is_rerun_on_fresh_prompts(monkeypatch):
    (result,), calls, rebuilt = run(monkeypatch, [1.1, 0.9, 0.05], retry_busy=3)
    assert calls == ["first", "fresh-1", "fresh-2"] and rebuilt == [(0, 1), (0, 2)]
    assert result.background_cpu == 0.05 and result.attempt == 2


def test_the_least_busy_attempt_is_kept(monkeypatch):
    (result,), calls, _ = run(monkeypatch, [0.5, 0.9], retry_busy=1)
    assert calls == ["first", "fresh-1"]
    assert result.background_cpu == 0.5 and result.attempt == 0


def test_no_retry_by_default_or_when_clean(monkeypatch):
    assert run(monkeypatch, [2.0], retry_busy=0)[1] == ["first"]
    assert run(monkeypatch, [0.1, 9.9], retry_busy=2)[1] == ["first"]
