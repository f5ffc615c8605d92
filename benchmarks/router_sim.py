"""The router's policies at 16-128 replicas, in simulation: the real `Router` (KV index fed
by KV events, cost model, bookings, policies) in front of simulated replicas (the engine's
KV cache manager with LRU eviction, continuous batching timed by measured step costs), on a
synthetic multi-turn chat trace whose load per replica is the same at every size.

Prints, per size and policy: the KV hit rate at the replicas (cached prompt tokens / prompt
tokens), TTFT p50/p90/p99, the router's wall time per decision, and the run's wall time.

    python benchmarks/router_sim.py [--replicas 16,64,128] [--policies cache_aware,round_robin]
        [--duration 90] [--warmup 30] [--write-trace DIR] [--trace FILE --replicas N]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.router.config import POLICIES, RouterConfig  # noqa: E402
from tokenmill.router.sim.replica import ReplicaConfig  # noqa: E402
from tokenmill.router.sim.report import Summary, table  # noqa: E402
from tokenmill.router.sim.simulator import Simulation  # noqa: E402
from tokenmill.router.sim.trace import Trace, TraceConfig, generate, mean_prompt_tokens  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--replicas", default="16,64,128", help="comma-separated sizes")
    p.add_argument("--policies", default="cache_aware,round_robin", help=f"of {POLICIES}")
    p.add_argument("--duration", type=float, default=90.0, help="trace window, seconds")
    p.add_argument("--warmup", type=float, default=30.0, help="requests before: not measured")
    p.add_argument("--session-rate", type=float, default=0.25, help="per replica per second")
    p.add_argument("--num-blocks", type=int, default=1024, help="KV blocks per replica")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", help="a JSONL trace (with one --replicas size) instead")
    p.add_argument("--write-trace", help="write each generated trace to DIR/trace-N.jsonl")
    p.add_argument("--out", help="write the summaries as JSON here")
    results_file.add_arguments(p)
    return p.parse_args()


def main() -> None:
    args = parse()
    logging.getLogger("tokenmill.router").setLevel(logging.ERROR)  # "replica ... is up"
    sizes = [int(n) for n in args.replicas.split(",")]
    policies = args.policies.split(",")
    if args.trace and len(sizes) != 1:
        raise SystemExit("--trace: give one --replicas size")
    try:
        loaded = Trace.load(args.trace) if args.trace else None
    except (OSError, ValueError) as e:
        raise SystemExit(f"--trace: {e}") from None
    replica = ReplicaConfig(num_blocks=args.num_blocks)
    print(f"cost model: {replica.costs.describe()}")
    print(
        f"replica: {replica.num_blocks} KV blocks of {replica.block_size} tokens, "
        f"budget {replica.max_num_batched_tokens} tokens/step, "
        f"max {replica.max_num_seqs} sequences"
    )
    summaries: list[Summary] = []
    started = time.perf_counter()
    for n in sizes:
        config = TraceConfig(
            replicas=n, duration_s=args.duration, session_rate=args.session_rate, seed=args.seed
        )
        trace = loaded or generate(config)
        if args.write_trace:
            Path(args.write_trace).mkdir(parents=True, exist_ok=True)
            trace.save(Path(args.write_trace) / f"trace-{n}.jsonl")
        print(
            f"\n{n} replicas: {len(trace.requests):,} requests, {len(trace.system_tokens)} "
            f"system-prompt families, mean prompt {mean_prompt_tokens(trace):,.0f} tokens, "
            f"{len(trace.requests) / args.duration / n:.2f} req/s per replica"
        )
        for policy in policies:
            result = Simulation(trace, n, RouterConfig(policy=policy), replica).run()
            s = Summary.of(result, args.warmup, args.duration)
            summaries.append(s)
            print(
                f"  {policy}: hit {s.hit_rate:.1%} (index predicted {s.predicted_hit_rate:.1%}), "
                f"TTFT p50 {s.ttft_p50:.2f} s p90 {s.ttft_p90:.2f} s, decide "
                f"{s.decide_us_mean:,.0f} µs, {dict(result.reasons)}, {s.wall_s:.1f} s"
            )
    print(f"\nmeasured: requests arriving in [{args.warmup:g} s, {args.duration:g} s)\n")
    print(table(summaries))
    results_file.write(
        "router-sim",
        table(summaries),  # markdown
        args,
        notes=[f"cost model: {replica.costs.describe()}; requests arriving in "
               f"[{args.warmup:g} s, {args.duration:g} s) measured"],
    )  # fmt: skip
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps([asdict(s) for s in summaries], indent=1))


if __name__ == "__main__":
    main()
