"""Plans and targets built from `tokenmill bench` arguments (nothing is started)."""

from __future__ import annotations

import argparse
import json

import pytest

from tokenmill.bench import compare
from tokenmill.bench.cli import add_bench_parser, build_plan, build_sources
from tokenmill.bench.compare import llama_ctx


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_concurrency_list_with_requests_per_load():
    plan = build_plan(parse("--concurrency", "1,8,32", "--num-requests", "8,32,96"))
    assert [load.concurrency for load in plan.loads] == [1, 8, 32]
    assert [w.num_requests for w in plan.workloads] == [8, 32, 96]
    assert plan.max_in_flight == 32
    with pytest.raises(ValueError, match="num-requests"):
        build_plan(parse("--concurrency", "1,8", "--num-requests", "1,2,3"))


def test_rate_loads_and_sweep():
    plan = build_plan(parse("--load", "poisson", "--rate", "2,4", "--burstiness", "0.5"))
    assert [(x.kind, x.rate, x.burstiness) for x in plan.loads] == [
        ("poisson", 2.0, 0.5), ("poisson", 4.0, 0.5),
    ]  # fmt: skip
    sweep = build_plan(parse("--load", "sweep", "--sweep-rates", "3", "--num-requests", "10"))
    assert sweep.sweep is not None and len(sweep.workloads) == 5


def test_workload_defaults(tmp_path):
    plan = build_plan(
        parse("--workload", "shared-prefix", "--num-groups", "3", "--prompts-per-group", "5")
    )
    assert plan.workloads[0].num_requests == 15
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps({"timestamp": i, "input_length": 4, "output_length": 2}) for i in range(7)
        )
    )
    plan = build_plan(parse("--workload", "trace", "--dataset", str(trace)))
    assert plan.loads[0].kind == "trace" and plan.workloads[0].num_requests == 7


def test_targets_and_peers():
    sources, baseline = build_sources(
        parse("--peer", "vllm=http://gpu:8000", "--endpoint", "chat"), build_plan(parse())
    )
    assert [(s.target.name, s.target.base_url, s.server) for s in sources] == [
        ("vllm", "http://gpu:8000", None)
    ]
    assert sources[0].target.endpoint == "chat" and baseline is None
    sources, _ = build_sources(parse(), build_plan(parse()))
    assert sources[0].target.base_url == "http://127.0.0.1:8000"
    with pytest.raises(ValueError, match="peer"):
        build_sources(parse("--peer", "nourl"), build_plan(parse()))


def test_compare_sources(monkeypatch, tmp_path):
    monkeypatch.setattr(compare, "default_model", lambda: "/models/m.gguf")
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    args = parse(
        "--compare", "--int8", "--bf16", "--concurrency", "1,32", "--llama-server-bin", str(fake),
        "--variant", "tm-small=--max-num-batched-tokens 256", "--llama-model", "f16=/m/f16.gguf",
    )  # fmt: skip
    sources, baseline = build_sources(args, build_plan(args))
    assert [s.target.name for s in sources] == [
        "tokenmill", "tm-small", "tokenmill-bf16", "tokenmill-int8", "llama-server", "f16"
    ]  # fmt: skip
    assert baseline == "llama-server"
    assert "256" in sources[1].server.argv and "bfloat16" in sources[2].server.argv
    assert sources[3].server is not None and "int8" in sources[3].server.argv
    llama = sources[4].server.command(1234)
    assert llama[llama.index("-np") + 1] == "32" and "-kvu" in llama and "1234" in llama
    f16 = sources[5].server.command(1234)
    assert f16[f16.index("-m") + 1] == "/m/f16.gguf" and f16[f16.index("-np") + 1] == "32"
    with pytest.raises(ValueError, match="--variant"):
        build_sources(parse("--compare", "--variant", "noflags"), build_plan(parse()))
    assert "--max-num-seqs" in sources[0].server.argv
    monkeypatch.setattr(compare, "find_llama_server", lambda: None)
    sources, baseline = build_sources(parse("--compare"), build_plan(parse()))
    assert [s.target.name for s in sources] == ["tokenmill"] and baseline is None


def test_llama_ctx_fits_every_slot():
    assert llama_ctx(16384, 32, 256) == 16384
    assert llama_ctx(16384, 16, 1160) == 20 * 1024  # 16 * 1224 = 19584, rounded up to 1 Ki
