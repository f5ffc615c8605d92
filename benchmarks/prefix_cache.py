"""Prefix caching and KV offload, measured with `tokenmill bench` against live servers.

Starts tokenmill (cache on / off; a small KV pool with and without offload tiers) and
llama.cpp's llama-server on the same model, runs the same workloads against each, and
prints TTFT p50/p99, output throughput and cache hit rate side by side with ratios:

1. shared prefix: 8 system prompts of ~1,000 tokens, 64 requests with short distinct
   suffixes (8 per prefix, interleaved);
2. multi-turn chat: later turns carry the earlier ones;
3. a working set larger than the KV pool: the same shared-prefix load on a pool that holds
   about a quarter of the prefixes, without offload, with a host-memory tier, with a disk tier.

    python benchmarks/prefix_cache.py [--quick] [--no-llama-server] [--out bench-results/prefix]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.bench.compare import default_model  # noqa: E402
from tokenmill.bench.peers import (  # noqa: E402
    ManagedServer,
    find_llama_server,
    llama_server_spec,
    tokenmill_spec,
)


def run_bench(
    targets: dict[str, str], workload: list[str], out: Path, concurrency: int
) -> list[dict]:
    (first_name, first_url), *peers = targets.items()
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "bench", "--base-url", first_url, "--name", first_name,
        *[a for name, url in peers for a in ("--peer", f"{name}={url}")],
        "--load", "concurrency", "--concurrency", str(concurrency), "--output-dir", str(out),
        "--no-plots", "--no-progress", "--warmup", "0", *workload,
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["runs"]


def print_table(title: str, runs: list[dict], baseline: str) -> None:
    base = next(r["summary"] for r in runs if r["target"] == baseline)
    print(f"\n{title}")
    print(f"{'target':28s} {'TTFT p50 ms':>12s} {'TTFT p99 ms':>12s} {'out tok/s':>10s} {'hit rate':>9s} "
          f"{'p50 vs ' + baseline:>22s}")  # fmt: skip
    for r in runs:
        s = r["summary"]
        ratio = (
            base["ttft_ms"]["median"] / s["ttft_ms"]["median"]
            if s["ttft_ms"]["median"]
            else float("nan")
        )
        failed = f"  ({s['failed']} failed)" if s["failed"] else ""
        print(
            f"{r['target']:28s} {s['ttft_ms']['median']:12.0f} {s['ttft_ms']['p99']:12.0f} "
            f"{s['output_throughput']:10.1f} {100 * s['cache_hit_rate']:8.1f}% {ratio:21.2f}x{failed}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--quick", action="store_true", help="smaller workloads (smoke run)")
    ap.add_argument("--no-llama-server", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--concurrency", type=int, default=4)
    results_file.add_arguments(ap)
    args = ap.parse_args()
    model = default_model()
    out = Path(args.out or tempfile.mkdtemp(prefix="prefix-bench-"))
    groups, per_group = (4, 4) if args.quick else (8, 8)
    shared = [
        "--workload", "shared-prefix", "--num-groups", str(groups), "--prompts-per-group", str(per_group),
        "--prefix-len", "1000", "--suffix-len", "32", "--output-len", "32",
        "--num-requests", str(groups * per_group),
    ]  # fmt: skip
    turns = [
        "--workload", "multi-turn", "--turns", "4", "--input-len", "200", "--output-len", "48",
        "--num-requests", "16" if args.quick else "48",
    ]  # fmt: skip
    serve = "--max-num-seqs 64"
    specs = [
        tokenmill_spec("tokenmill cache", model, serve),
        tokenmill_spec("tokenmill no-cache", model, serve + " --no-prefix-caching"),
    ]
    binary = None if args.no_llama_server else find_llama_server()
    if binary is not None:
        specs.append(llama_server_spec(binary, model, slots=args.concurrency, ctx=32768))
    tables: list[str] = []  # what print_table prints, for the results file
    servers = [ManagedServer(s, out / "logs") for s in specs]
    try:
        for s in servers:
            s.start()
        targets = {s.spec.name: s.base_url for s in servers}
        shared_runs = run_bench(targets, shared, out / "shared", args.concurrency)
        turns_runs = run_bench(targets, turns, out / "turns", args.concurrency)
    finally:
        for s in servers:
            s.stop()
    with results_file.printed() as table:
        print_table("shared prefix (TTFT ratios: no-cache / target)",
                    shared_runs, "tokenmill no-cache")  # fmt: skip
        print_table("multi-turn chat", turns_runs, "tokenmill no-cache")
    tables.append(table.getvalue())

    # Working set > KV pool: ~1/4 of the 8 prefixes fit on the device.
    small = serve + " --kv-cache-memory 0.1"
    tier_specs = [
        tokenmill_spec("small pool, no offload", model, small),
        tokenmill_spec("small pool + host tier", model, small + " --kv-offload-memory 1"),
        tokenmill_spec(
            "small pool + disk tier",
            model,
            small + f" --kv-offload-disk 2 --kv-offload-path {out / 'kvdisk'}",
        ),
    ]
    servers = [ManagedServer(s, out / "logs") for s in tier_specs]
    try:
        for s in servers:
            s.start()
        targets = {s.spec.name: s.base_url for s in servers}
        tier_runs = run_bench(targets, shared, out / "tiers", args.concurrency)
    finally:
        for s in servers:
            s.stop()
    with results_file.printed() as table:
        print_table("working set larger than the KV pool (TTFT ratios: no offload / target)",
                    tier_runs, "small pool, no offload")  # fmt: skip
    tables.append(table.getvalue())
    results_file.write("prefix-cache", results_file.text_block("".join(tables)), args)
    print(f"\nreports: {out}")


if __name__ == "__main__":
    main()
