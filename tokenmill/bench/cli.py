"""`tokenmill bench`: argument parsing; builds targets, the plan, and writes the report."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tokenmill.ports import add_port_range_option

if TYPE_CHECKING:  # the harness is imported when `bench` runs, not to build the CLI
    from tokenmill.bench.plan import Plan
    from tokenmill.bench.session import Source

DEFAULT_URL = "http://127.0.0.1:8000"


def _floats(text: str) -> list[float]:
    return [float(x) for x in str(text).split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def add_bench_parser(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark OpenAI-compatible servers (tokenmill, vLLM, llama-server)",
        description="Load an OpenAI-compatible server and report TTFT/TPOT/ITL/throughput "
        "(vLLM `bench serve` definitions). --compare starts tokenmill and llama-server.",
    )
    t = p.add_argument_group("targets")
    t.add_argument("--base-url", default=None, help=f"server to load (default {DEFAULT_URL})")
    t.add_argument("--name", default=None, help="label of --base-url in reports")
    t.add_argument("--served-model", default=None, help="model id to send (default: /v1/models)")
    t.add_argument("--api-key", default=None)
    t.add_argument("--endpoint", choices=["chat", "completions"], default="completions")
    t.add_argument(
        "--peer", action="append", default=[], metavar="NAME=URL",
        help="another running OpenAI-compatible server to include (repeatable)",
    )  # fmt: skip
    t.add_argument("--no-ignore-eos", action="store_true", help="don't send ignore_eos/min_tokens")
    t.add_argument("--request-timeout", type=float, default=600.0, metavar="S")
    c = p.add_argument_group("compare (servers started here)")
    c.add_argument("--compare", action="store_true", help="start tokenmill and llama-server")
    c.add_argument("--model", default=None, help="GGUF file for both (default: embedded model)")
    c.add_argument("--tokenmill-args", default="--max-num-seqs 64", help="extra serve flags")
    c.add_argument("--int8", action="store_true", help="add a tokenmill --quantization int8 row")
    c.add_argument("--bf16", action="store_true", help="add a tokenmill --dtype bfloat16 row")
    c.add_argument(
        "--variant", action="append", default=[], metavar="NAME=FLAGS",
        help="add a tokenmill row started with these extra serve flags (repeatable)",
    )  # fmt: skip
    c.add_argument("--no-llama-server", action="store_true", help="compare without llama-server")
    c.add_argument("--llama-server-bin", default=None, help="llama-server binary")
    c.add_argument("--llama-threads", type=int, default=2)
    c.add_argument("--llama-ctx", type=int, default=16384, help="total KV context (raised to fit)")
    c.add_argument("--llama-slots", type=int, default=None, help="-np (default: max concurrency)")
    c.add_argument("--llama-args", default="", help="extra llama-server flags")
    c.add_argument(
        "--llama-model", action="append", default=[], metavar="NAME=GGUF",
        help="add a llama-server row on another file, e.g. an F16 GGUF (repeatable)",
    )  # fmt: skip
    c.add_argument("--baseline", default=None, help="target the ratios divide by")
    add_port_range_option(c, "servers")
    add_load_and_workload_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--slo", default=None, help="goodput SLOs, e.g. ttft=500ms,tpot=50ms")
    o.add_argument("--output-dir", default=None, help="default ./bench-results/<timestamp>")
    o.add_argument("--no-plots", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_bench)


def add_load_and_workload_args(p: argparse.ArgumentParser) -> None:
    """The load and workload flags (shared with `tokenmill tune`, which runs this harness)."""
    ld = p.add_argument_group("load")
    ld.add_argument(
        "--load", default=None,
        choices=["concurrency", "constant", "poisson", "throughput", "sweep", "trace"],
        help="default: trace for --workload trace, else concurrency",
    )  # fmt: skip
    ld.add_argument("--concurrency", default="1", help="comma list, one run each: 1,8,32")
    ld.add_argument("--rate", default="1", help="req/s, comma list (constant, poisson)")
    ld.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (poisson)")
    ld.add_argument("--max-concurrency", type=int, default=None, help="cap for open-loop loads")
    ld.add_argument("--num-requests", default=None, help="per run; one value or one per load")
    ld.add_argument("--max-duration", type=float, default=None, metavar="S", help="stop sending")
    ld.add_argument("--sweep-rates", type=int, default=4, help="sweep: rates in between")
    ld.add_argument("--sweep-kind", choices=["constant", "poisson"], default="constant")
    ld.add_argument("--warmup", type=int, default=1, help="short requests before measuring")
    ld.add_argument(
        "--retry-busy", type=int, default=0, metavar="N",
        help="rerun a run (fresh prompts) when other processes used CPU during it, up to N times",
    )  # fmt: skip
    ld.add_argument(
        "--wait-idle", type=float, default=0.0, metavar="S",
        help="before each run wait up to S seconds until other processes use < 0.25 cores",
    )  # fmt: skip
    ld.add_argument(
        "--seed", type=int, default=None,
        help="workload seed (default: a fresh one per invocation, recorded in results.json)",
    )  # fmt: skip
    w = p.add_argument_group("workload")
    w.add_argument(
        "--workload", default="random",
        choices=["random", "shared-prefix", "multi-turn", "jsonl", "trace"],
    )  # fmt: skip
    w.add_argument("--input-len", default="128", help="128 | uniform:64-256 | normal:128,32")
    w.add_argument("--output-len", default="128", help="same forms as --input-len")
    w.add_argument("--prompt-source", choices=["auto", "tokens", "words"], default="auto")
    w.add_argument("--num-groups", type=int, default=8, help="shared-prefix groups")
    w.add_argument("--prompts-per-group", type=int, default=8)
    w.add_argument("--prefix-len", type=int, default=1000)
    w.add_argument("--suffix-len", type=int, default=32)
    w.add_argument("--turns", type=int, default=3, help="multi-turn: turns per conversation")
    w.add_argument("--turn-delay", type=float, default=0.0, metavar="S")
    w.add_argument("--dataset", default=None, help="JSONL prompts or trace file")
    w.add_argument("--trace-time-unit", choices=["s", "ms"], default="s")
    w.add_argument("--trace-speedup", type=float, default=1.0)


def _rows_in(path: str | None) -> int:
    if not path:
        return 0
    return sum(1 for line in Path(path).read_text().splitlines() if line.strip())


def build_plan(args: argparse.Namespace) -> Plan:
    from tokenmill.bench.config import LoadSpec
    from tokenmill.bench.lengths import LengthDist
    from tokenmill.bench.plan import SweepSpec, fixed_plan, sweep_plan
    from tokenmill.bench.workloads import WorkloadSpec

    if args.workload == "shared-prefix":
        default_n = args.num_groups * args.prompts_per_group
    elif args.workload in ("jsonl", "trace"):
        default_n = _rows_in(args.dataset)
    else:
        default_n = 100
    nums = _ints(args.num_requests) if args.num_requests else [default_n]
    spec = WorkloadSpec(
        kind=args.workload,
        num_requests=nums[0],
        input_len=LengthDist.parse(args.input_len),
        output_len=LengthDist.parse(args.output_len),
        num_groups=args.num_groups,
        prompts_per_group=args.prompts_per_group,
        prefix_len=args.prefix_len,
        suffix_len=args.suffix_len,
        turns=args.turns,
        path=args.dataset,
        trace_time_unit=args.trace_time_unit,
        trace_speedup=args.trace_speedup,
    )
    load = args.load or ("trace" if args.workload == "trace" else "concurrency")
    if load == "sweep":
        return sweep_plan(
            spec,
            SweepSpec(args.sweep_rates, args.sweep_kind, args.burstiness, args.max_concurrency),
        )
    if load == "concurrency":
        loads = [LoadSpec("concurrency", concurrency=c) for c in _ints(args.concurrency)]
    elif load in ("constant", "poisson"):
        loads = [
            LoadSpec(load, rate=r, burstiness=args.burstiness, max_concurrency=args.max_concurrency)
            for r in _floats(args.rate)
        ]
    else:
        loads = [LoadSpec(load, max_concurrency=args.max_concurrency)]
    return fixed_plan(spec, loads, nums)


def build_sources(args: argparse.Namespace, plan: Plan) -> tuple[list[Source], str | None]:
    from tokenmill.bench.config import Target
    from tokenmill.bench.session import Source

    common = dict(
        endpoint=args.endpoint,
        api_key=args.api_key,
        ignore_eos=not args.no_ignore_eos,
        request_timeout_s=args.request_timeout,
    )
    sources: list[Source] = []
    baseline = args.baseline
    if args.compare:
        from tokenmill.bench.compare import compare_sources

        managed, base = compare_sources(args, plan, common)
        sources += managed
        baseline = baseline or base
    if args.base_url or not (args.compare or args.peer):
        url = args.base_url or DEFAULT_URL
        sources.append(
            Source(Target(args.name or url.split("//")[-1], url, model=args.served_model, **common))
        )
    for peer in args.peer:
        name, sep, url = peer.partition("=")
        if not sep or not url.startswith("http"):
            raise ValueError(f"peer: {peer!r} is not NAME=URL")
        sources.append(Source(Target(name, url, **common)))
    return sources, baseline


def cmd_bench(args: argparse.Namespace) -> int:
    from tokenmill.bench.config import SLO
    from tokenmill.bench.execute import RunOptions
    from tokenmill.bench.report.write import write_report
    from tokenmill.bench.session import run_session
    from tokenmill.console import OutputConsole
    from tokenmill.ports import PortPool

    console = OutputConsole(width=None if sys.stdout.isatty() else 200)
    if args.port_range is not None and not args.compare:
        raise ValueError("--port-range: for the servers --compare starts")
    plan = build_plan(args)
    sources, baseline = build_sources(args, plan)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = Path(args.output_dir or Path("bench-results") / stamp)
    # A fresh seed per invocation: a rerun of the same command must not find its prompts in
    # the server's prefix cache. The seed is reported so --seed can reproduce the run.
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    console.print(f"seed {seed} (--seed {seed} reproduces these prompts)")
    options = RunOptions(
        slo=SLO.parse(args.slo),
        seed=seed,
        warmup=args.warmup,
        max_duration_s=args.max_duration,
        turn_delay_s=args.turn_delay,
        progress=not args.no_progress,
        wait_idle_s=args.wait_idle,
        retry_busy=args.retry_busy,
    )
    ports = PortPool(args.port_range) if args.port_range is not None else None
    results, workloads, skipped = asyncio.run(
        run_session(sources, plan, options, console, out_dir / "logs", args.prompt_source, ports)
    )
    if not results:
        console.print("[red]no results")
        return 1
    names = {r.target for r in results}
    write_report(
        out_dir, results, workloads, sources, skipped, options, console,
        baseline=baseline if baseline in names else None, plots=not args.no_plots,
        argv=sys.argv,
    )  # fmt: skip
    failed = sum(r.summary.failed for r in results)
    return 0 if failed == 0 else 3
