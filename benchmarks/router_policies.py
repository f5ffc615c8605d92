"""Routing policies on a 2-replica cluster, measured with `tokenmill bench`.

For each policy a fresh `tokenmill cluster --replicas 2` (cold caches, threads split between
the replicas) serves the same multi-tenant workload: T tenants, each with a ~1,000-token
system prompt, short distinct questions, Poisson arrivals (same seed, so the same prompts
at the same instants for every policy). Each replica's KV pool holds about 10 of the 16
prompts — the cluster's pool holds them all only if each prompt lives on one replica, which
is what cache-aware routing is for. Prints TTFT p50/p90, throughput and the replicas'
reported cache hit rate per policy, with ratios against round robin.

    python benchmarks/router_policies.py [--quick] [--rate 0.8] [--out bench-results/router]
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.router.cluster import free_port  # noqa: E402


def start_cluster(
    policy: str, args: argparse.Namespace, log_dir: Path
) -> tuple[subprocess.Popen, str]:
    flags = ["--replicas", "2", "--policy", policy, "--kv-cache-memory", str(args.kv_cache_memory),
             "--max-num-seqs", "64"]  # fmt: skip
    return launch_cluster(flags, log_dir)


def launch_cluster(flags: list[str], log_dir: Path) -> tuple[subprocess.Popen, str]:
    """`tokenmill cluster FLAGS` on a free port, once every replica is healthy and its KV
    events synced: (the process, the router's URL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "tokenmill.cli", "cluster", "--port", str(port),
           "--log-dir", str(log_dir), *flags]  # fmt: skip
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "cluster.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((log_dir / "cluster.log").read_text())
        try:
            info = httpx.get(url + "/router_info", timeout=2).json()
            if all(r["healthy"] and r["events"] == "synced" for r in info["replicas"]):
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("cluster not ready")


def router_counters(url: str) -> dict[str, float]:
    """Decisions by reason and guard triggers from the router's /metrics."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tokenmill:router_decisions_total{"):
            reason = line.split('reason="')[1].split('"')[0]
            out[reason] = out.get(reason, 0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("tokenmill:router_imbalance_guard_total "):
            out["guard_triggers"] = float(line.rsplit(" ", 1)[1])
    return out


def run_policy(policy: str, args: argparse.Namespace, out: Path) -> dict:
    proc, url = start_cluster(policy, args, out / "logs" / policy)
    try:
        n = args.tenants * args.per_tenant
        cmd = [
            sys.executable, "-m", "tokenmill.cli", "bench", "--base-url", url, "--name", policy,
            "--endpoint", "chat", "--workload", "shared-prefix",
            "--num-groups", str(args.tenants), "--prompts-per-group", str(args.per_tenant),
            "--prefix-len", str(args.prefix_len), "--suffix-len", "32", "--output-len", "32",
            "--num-requests", str(n), "--load", "poisson", "--rate", str(args.rate),
            "--seed", str(args.seed), "--warmup", "0", "--no-plots", "--no-progress",
            "--output-dir", str(out / policy),
        ]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        run = json.loads((out / policy / "results.json").read_text())["runs"][0]
        run["router"] = router_counters(url)
        run["placement"] = httpx.get(url + "/router_info", timeout=10).json()
        return run
    finally:
        stop_cluster(proc)


def stop_cluster(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()


def print_table(runs: dict[str, dict], baseline: str) -> None:
    base = runs[baseline]["summary"]
    print(f"\n{'policy':12s} {'TTFT p50 ms':>12s} {'TTFT p90 ms':>12s} {'req/s':>7s} "
          f"{'out tok/s':>10s} {'hit rate':>9s} {'p90 vs ' + baseline:>20s}  decisions")  # fmt: skip
    for name, run in runs.items():
        s = run["summary"]
        ratio = base["ttft_ms"]["p90"] / s["ttft_ms"]["p90"]
        failed = f" ({s['failed']} failed)" if s["failed"] else ""
        reasons = ", ".join(f"{k} {v:.0f}" for k, v in sorted(run["router"].items()))
        print(
            f"{name:12s} {s['ttft_ms']['median']:12.0f} {s['ttft_ms']['p90']:12.0f} "
            f"{s['request_throughput']:7.2f} {s['output_throughput']:10.1f} "
            f"{100 * s['cache_hit_rate']:8.1f}% {ratio:19.2f}x  {reasons}{failed}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--quick", action="store_true", help="4 tenants x 4 requests (smoke run)")
    ap.add_argument("--policies", default="cache_aware,round_robin,least_load")
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--per-tenant", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=0.8, help="requests/s (Poisson)")
    ap.add_argument("--kv-cache-memory", type=float, default=0.45, help="GiB per replica")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    results_file.add_arguments(ap)
    args = ap.parse_args()
    if args.quick:
        args.tenants, args.per_tenant = 4, 4
    out = Path(args.out or tempfile.mkdtemp(prefix="router-bench-"))
    runs = {p: run_policy(p, args, out) for p in args.policies.split(",")}
    (out / "summary.json").write_text(json.dumps(runs, indent=2, default=str) + "\n")
    with results_file.capture("router-policies", args):
        print(
            f"{args.tenants} tenants x {args.per_tenant} requests, ~{args.prefix_len}-token system "
            f"prompts, Poisson {args.rate} req/s, 2 replicas x {args.kv_cache_memory} GiB KV"
        )
        baseline = "round_robin" if "round_robin" in runs else next(iter(runs))
        print_table(runs, baseline)
    print(f"\nreports: {out}")


if __name__ == "__main__":
    main()
