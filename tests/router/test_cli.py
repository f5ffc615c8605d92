"""`tokenmill router` / `tokenmill cluster` argument handling."""

from __future__ import annotations

import pytest

from tokenmill.cli import build_parser
from tokenmill.router.cli import engine_argv, router_config
from tokenmill.router.cluster import threads_per_replica


def test_cluster_passes_engine_flags_to_replicas():
    args = build_parser().parse_args(
        ["cluster", "--replicas", "3", "--kv-cache-memory", "0.5", "--no-prefix-caching",
         "--num-threads", "2", "--kv-events-endpoint", "tcp://*:1", "--policy", "least_load"]
    )  # fmt: skip
    # the cluster sets threads and event endpoints per replica itself
    assert engine_argv(args) == ["--kv-cache-memory", "0.5", "--no-prefix-caching"]
    assert args.replicas == 3 and router_config(args).policy == "least_load"


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
