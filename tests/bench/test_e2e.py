"""`tokenmill bench` against a real `tokenmill serve` on a free port."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest

from tests.server.conftest import start_server
from tokenmill.bench.cli import add_bench_parser, cmd_bench


def bench(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", *argv])
    return args.func(args)


def test_tokenmill_cli_has_bench():
    from tokenmill.cli import build_parser

    args = build_parser().parse_args(["bench", "--concurrency", "1,8", "--slo", "ttft=1s"])
    assert args.func is cmd_bench and args.concurrency == "1,8"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(
        tmp_path_factory.mktemp("bench-server"), "--max-num-seqs", "8", "--num-threads", "1"
    )
    yield srv
    srv.stop()


def load_doc(out) -> dict:
    return json.loads((out / "results.json").read_text())


def test_random_workload_report(server, tmp_path):
    out = tmp_path / "report"
    code = bench(
        "--base-url", server.base_url, "--num-requests", "8", "--concurrency", "4",
        "--input-len", "32", "--output-len", "16", "--slo", "ttft=30s,tpot=10s",
        "--output-dir", str(out), "--no-progress", "--warmup", "1",
    )  # fmt: skip
    assert code == 0
    doc = load_doc(out)
    assert doc["meta"]["workloads"][0]["prompts"] == "random-token-ids"
    (run,) = doc["runs"]
    assert run["load"]["label"] == "c=4" and run["target"] == server.base_url.split("//")[1]
    # the kernel switches the server ran with (/server_info), its row limit resolved
    kernels = run["kernels"]
    assert kernels["int_dot"] is True and kernels["int_dot_max_rows"] is not None
    assert {"greedy_argmax", "fused_decode", "prefetch", "native_kernels"} <= set(kernels)
    s = run["summary"]
    assert (s["num_requests"], s["completed"], s["failed"]) == (8, 8, 0)
    assert s["total_output_tokens"] == 8 * 16  # ignore_eos + min_tokens
    assert s["total_input_tokens"] == 8 * 32  # exact lengths via /tokenize + /detokenize
    assert s["output_throughput"] > 0 and s["request_throughput"] > 0
    assert s["goodput"] == pytest.approx(s["request_throughput"])
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert s[metric]["count"] > 0 and s[metric]["p99"] >= s[metric]["median"] > 0
    assert s["itl_ms"]["count"] == 8 * 15
    assert 1.0 < s["mean_concurrency"] <= 4.0
    reqs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 8 and all(sum(r["chunk_tokens"]) == 16 for r in reqs)
    html = (out / "report.html").read_text()
    for png in (
        "ttft_cdf",
        "tpot_cdf",
        "e2e_cdf",
        "throughput_vs_concurrency",
        "ttft_vs_load",
        "pareto",
    ):
        path = out / f"{png}.png"
        assert path.stat().st_size > 1000 and f"{png}.png" in html
    assert (out / "results.csv").read_text().count("\n") == 2


def test_shared_prefix_hits_the_cache_over_chat(server, tmp_path):
    out = tmp_path / "prefix"
    code = bench(
        "--base-url", server.base_url, "--endpoint", "chat", "--workload", "shared-prefix",
        "--num-groups", "2", "--prompts-per-group", "3", "--prefix-len", "96",
        "--suffix-len", "8", "--output-len", "4", "--concurrency", "1",
        "--output-dir", str(out), "--no-progress", "--no-plots", "--warmup", "0",
    )  # fmt: skip
    assert code == 0
    s = load_doc(out)["runs"][0]["summary"]
    assert s["completed"] == 6 and s["failed"] == 0
    reqs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert s["cached_tokens"] == sum(r["cached_tokens"] for r in reqs)
    assert s["cache_hit_rate"] == pytest.approx(s["cached_tokens"] / s["total_input_tokens"])
    if prefix_cache_queries(server) > 0:  # the server caches prefixes: the groups must hit
        # 2 of 3 prompts per group find at least the 96-token prefix's full blocks cached
        assert s["cached_tokens"] >= 4 * 64 and 0.3 < s["cache_hit_rate"] < 1.0


def prefix_cache_queries(server) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tokenmill:prefix_cache_queries_total")
    )


def test_multi_turn_conversations_grow(server, tmp_path):
    out = tmp_path / "turns"
    code = bench(
        "--base-url", server.base_url, "--endpoint", "chat", "--workload", "multi-turn",
        "--num-requests", "4", "--turns", "2", "--input-len", "16", "--output-len", "6",
        "--load", "poisson", "--rate", "20", "--output-dir", str(out), "--no-progress",
        "--no-plots", "--warmup", "0",
    )  # fmt: skip
    assert code == 0
    reqs = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == 4 and all(r["success"] for r in reqs)
    by_conv = {}
    for r in reqs:
        by_conv.setdefault(r["session_id"], {})[r["turn"]] = r["prompt_tokens"]
    for turns in by_conv.values():
        assert turns[1] > turns[0] + 16  # the second turn carries the first and its reply
