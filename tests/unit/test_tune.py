"""The tuner's search logic on a synthetic server (a cost model with a known optimum): the
frontier, the SLO pick, pruning, and resuming an interrupted tune."""

from __future__ import annotations

import itertools
import json

import pytest

from tokenmill.tune.frontier import Point, pareto_frontier, pick
from tokenmill.tune.search import next_config
from tokenmill.tune.space import SearchSpace, config_argv, config_key
from tokenmill.tune.trials import Trial, TrialStore

SPACE = {
    "max-num-seqs": [2, 4, 8, 16, 32, 64, 128],
    "max-num-batched-tokens": [128, 256, 512, 1024, 2048, 4096],
    "weights": ["native", "int8"],
}


def synthetic(config: dict) -> Trial:
    """A server whose total throughput grows with concurrency until the batch budget
    saturates it, and whose per-user speed falls with concurrency; int8 is 10% faster.
    SLO: met while per-user speed stays above 12 tok/s."""
    seqs, budget = config["max-num-seqs"], config["max-num-batched-tokens"]
    speed = 1.1 if config["weights"] == "int8" else 1.0
    total = speed * min(40 * seqs**0.6, budget / 12 + 20 * seqs**0.3)
    per_user = total / seqs
    return Trial(config, per_user, total, 1.0 if per_user >= 12 else 0.5, 0.02, True)


def test_frontier_and_pick():
    pts = [
        Point("a", 50, 50), Point("b", 40, 100), Point("c", 30, 90),  # c dominated by b
        Point("d", 10, 200, slo_attainment=0.5), Point("e", 20, 150, slo_attainment=0.95),
        Point("f", 20, 140), Point("g", 5, 300, clean=False),
    ]  # fmt: skip
    assert [p.key for p in pareto_frontier(pts)] == ["g", "d", "e", "b", "a"]
    assert pick(pts, 0.9).key == "e"  # g is unclean, d misses the SLO
    assert pick([Point("x", 1, 1, slo_attainment=0.1)], 0.9) is None
    assert pareto_frontier([]) == []


def run_tune(store: TrialStore, space: SearchSpace, limit: int | None = None) -> int:
    n = 0
    while limit is None or n < limit:
        config = next_config(space, store.measured())
        if config is None:
            break
        store.add(synthetic(config))
        n += 1
    return n


def true_best(space: SearchSpace) -> Trial:
    trials = [synthetic(space.config(i)) for i in space.all_indices()]
    return max((t for t in trials if t.slo_attainment >= 0.9), key=lambda t: (t.total, t.per_user))


def test_search_finds_the_slo_optimum_with_fewer_trials_than_the_grid(tmp_path):
    space = SearchSpace.from_mapping(SPACE)
    store = TrialStore(tmp_path / "trials.jsonl")
    n = run_tune(store, space)
    measured = store.measured()
    assert len(measured) == n  # nothing measured twice
    assert all(config_key(space.config(i)) in measured for i in space.coarse_indices())
    assert n < space.size / 2, (n, space.size)
    best = pick([t.point() for t in measured.values()])
    assert best is not None and best.total == pytest.approx(true_best(space).total)  # (ties)


def test_an_interrupted_tune_resumes_without_repeating_a_trial(tmp_path):
    space = SearchSpace.from_mapping(SPACE)
    path = tmp_path / "trials.jsonl"
    assert run_tune(TrialStore(path), space, limit=7) == 7
    with open(path, "a") as f:
        f.write('{"config": {"max-num-seqs": 4')  # torn by a crash
    resumed = TrialStore(path)
    assert len(resumed.trials) == 7
    n = run_tune(resumed, space)
    keys = [t.key for t in TrialStore(path).trials]
    assert len(keys) == len(set(keys)) == 7 + n
    uninterrupted = TrialStore(tmp_path / "again.jsonl")
    run_tune(uninterrupted, space)
    assert set(uninterrupted.measured()) == set(keys)  # the same search, resumed


def test_space_parsing_and_argv():
    space = SearchSpace.from_mapping({"max_num_seqs": [8, 16], "--speculative": [None, "ngram"]})
    assert [k.flag for k in space.knobs] == ["max-num-seqs", "speculative"]
    configs = [space.config(i) for i in space.all_indices()]
    assert len(configs) == space.size == 4
    assert config_argv(configs[0]) == ["--max-num-seqs", "8"]
    assert config_argv(configs[-1]) == ["--max-num-seqs", "16", "--speculative", "ngram"]
    assert space.neighbours((0, 0)) == [(1, 0), (0, 1)]
    for bad in ({"x": []}, {"x": [1, 1]}, {"x": [True]}, {"x": [{"a": 1}]}):
        with pytest.raises(ValueError, match="space"):
            SearchSpace.from_mapping(bad)
    with pytest.raises(ValueError, match="configurations"):
        SearchSpace.from_mapping({f"k{i}": list(range(10)) for i in range(6)})
    assert config_key({"a": 1, "b": 2}) == config_key(json.loads('{"b": 2, "a": 1}'))
    assert len(list(itertools.islice(SearchSpace.default().all_indices(), 3))) == 3


def test_replicas_knob_runs_a_cluster_and_splits_the_threads():
    from tokenmill.tune.space import launch_command

    space = SearchSpace.from_mapping({"replicas": [1, 2], "max-num-seqs": [8]})
    one, two = (space.config(i) for i in space.all_indices())
    assert config_argv(one) == ["--max-num-seqs", "8"] and launch_command(one) == "serve"
    assert config_argv(two) == ["--replicas", "2", "--max-num-seqs", "8"]
    assert launch_command(two) == "cluster"
    for bad in ([0], [1.5], ["2"], [65]):
        with pytest.raises(ValueError, match="replicas"):
            SearchSpace.from_mapping({"replicas": bad})
    assert "replicas" in [k.flag for k in SearchSpace.default(cores=2).knobs]
    assert "replicas" not in [k.flag for k in SearchSpace.default(cores=1).knobs]
