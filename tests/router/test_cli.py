"""`tokenmill router` / `tokenmill cluster` argument handling."""

from __future__ import annotations

import pytest

from tokenmill.cli import build_parser
from tokenmill.cluster.cli import engine_argv
from tokenmill.router import cluster
from tokenmill.router.cli import router_config
from tokenmill.router.cluster import threads_per_replica


def test_cluster_passes_engine_flags_to_replicas():
    args = build_parser().parse_args(
        ["cluster", "--replicas", "3", "--kv-cache-memory", "0.5", "--no-prefix-caching",
         "--num-threads", "2", "--kv-events-endpoint", "tcp://*:1", "--policy", "least_load"]
    )  # fmt: skip
    # the cluster sets threads and event endpoints per replica itself
    assert engine_argv(args) == ["--kv-cache-memory", "0.5", "--no-prefix-caching"]
    assert args.replicas == 3 and router_config(args).policy == "least_load"


def test_cluster_passes_switches_as_typed():
    args = build_parser().parse_args(
        ["cluster", "--no-speculative-lookup", "--no-int-dot", "--greedy-argmax",
         "--int-dot-max-rows", "any", "--no-warm-up"]
    )  # fmt: skip
    assert engine_argv(args) == [
        "--no-speculative-lookup", "--no-warm-up", "--no-int-dot", "--int-dot-max-rows", "any",
        "--greedy-argmax",
    ]  # fmt: skip


def test_router_flags_make_a_config():
    args = build_parser().parse_args(
        ["router", "--replica", "http://a:1", "--replica", "b:2,tcp://*:3", "--decode-weight",
         "0.5", "--balance-abs-threshold", "8", "--balance-rel-threshold", "2"]
    )  # fmt: skip
    config = router_config(args)
    assert config.policy == "cache_aware" and config.weights.decode == 0.5
    assert (config.guard.abs_threshold, config.guard.rel_threshold) == (8, 2.0)
    assert args.replica == ["http://a:1", "b:2,tcp://*:3"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["router"])  # --replica is required


def test_threads_split_between_replicas():
    assert threads_per_replica(2, cores=8) == 4
    assert threads_per_replica(3, cores=2) == 1


def test_cluster_stops_the_replicas_it_started_when_one_fails_to_start(tmp_path, monkeypatch):
    started: list[FakeProcess] = []

    def start_replica(*args, **kwargs) -> FakeProcess:
        if len(started) == 2:
            raise OSError("no free port")
        started.append(FakeProcess())
        return started[-1]

    monkeypatch.setattr(cluster, "start_replica", start_replica)
    with pytest.raises(OSError):
        cluster.start_cluster(3, [], tmp_path, threads=1)
    assert [p.stopped for p in started] == [True, True]


class FakeProcess:
    def __init__(self) -> None:
        self.stopped = False

    def terminate(self) -> None:
        self.stopped = True

    def stop(self) -> int:
        self.stopped = True
        return 0


def test_replica_log_is_closed_when_its_process_cannot_start(tmp_path, monkeypatch):
    opened = []

    def fake_open(*args, **kwargs):
        opened.append(open(*args, **kwargs))  # noqa: SIM115
        return opened[-1]

    def popen(*args, **kwargs):
        raise OSError("exec failed")

    monkeypatch.setattr(cluster, "open", fake_open, raising=False)
    monkeypatch.setattr(cluster.subprocess, "Popen", popen)
    with pytest.raises(OSError):
        cluster.start_replica([], tmp_path, 1)
    assert len(opened) == 1 and opened[0].closed
