"""`tokenmill bench` seeds: a fresh one per invocation (so a rerun doesn't hit the server's
prefix cache), --seed reproduces a run, and results.json records the seed used."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.bench.fakes import FakeMaker
from tests.bench.fixtures import REC_A
from tokenmill.bench import session
from tokenmill.bench.cli import add_bench_parser
from tokenmill.bench.metrics import summarize
from tokenmill.bench.results import RunResult
from tokenmill.bench.workloads import Workload


@pytest.fixture
def sent(monkeypatch) -> list[list[Workload]]:
    """The workloads each invocation would send (no server: fake prompts, runs not sent)."""
    invocations: list[list[Workload]] = []

    async def fake_maker(client, base_url, source):
        return FakeMaker()

    async def fake_run_target(target, runs, options, console=None, stage="", rebuild=None):
        invocations.append([w for w, _ in runs])
        return [
            RunResult(target.name, w.name, load, summarize([REC_A]), (REC_A,)) for w, load in runs
        ]

    monkeypatch.setattr(session, "prompt_maker", fake_maker)
    monkeypatch.setattr(session, "run_target", fake_run_target)
    return invocations


def bench(out: Path, *argv: str) -> int:
    """Runs `tokenmill bench` (two runs: c=1 and c=4); returns the seed results.json records."""
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["bench", "--concurrency", "1,4", "--num-requests", "6", "--input-len", "16",
         "--output-dir", str(out), "--no-plots", "--no-progress", "--warmup", "0", *argv]
    )  # fmt: skip
    assert args.func(args) == 0
    return json.loads((out / "results.json").read_text())["meta"]["options"]["seed"]


def test_each_invocation_gets_fresh_prompts(sent, tmp_path):
    seeds = [bench(tmp_path / "a"), bench(tmp_path / "b")]
    assert seeds[0] != seeds[1]
    first, second = sent
    assert first[0] != second[0] and first[1] != second[1], "a rerun must not warm the cache"
    assert first[0] != first[1], "runs within one invocation still get their own prompts"


def test_recorded_seed_reproduces_the_prompts(sent, tmp_path):
    seed = bench(tmp_path / "fresh")
    assert bench(tmp_path / "again", "--seed", str(seed)) == seed
    assert bench(tmp_path / "fixed", "--seed", "7") == 7
    assert bench(tmp_path / "fixed2", "--seed", "7") == 7
    fresh, again, fixed, fixed2 = sent
    assert again == fresh and fixed == fixed2 and fixed != fresh
