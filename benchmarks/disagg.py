"""Prefill/decode disaggregation on this machine: KV transfer speed, and a mixed workload
served aggregated, always disaggregated and conditionally disaggregated.

Part 1, transfer: a prefill-side block server in its own process (the real KVProducer and
KVBlockServer over a KV pool of the embedded model's shape) serves finished transfers of
1k / 4k / 8k tokens; this process pulls them with the real client over TCP and shared
memory. Printed: GB/s and ms per 1k tokens, next to the limits measured in the same run:
memcpy (torch copy) and loopback (one large ZMQ frame between the same two processes).

Part 2, the threshold: what a local prefill of N tokens costs the streams of a decode worker
(the engine step that carries it, beside 4 decoding streams, on one thread) next to what
moving the same blocks costs; `--pd-min-uncached-tokens` is chosen from it.

Part 3, serving (`tokenmill bench`, same total threads): short chats (~150-token prompts,
64 output tokens) at a steady rate with long prompts (2-8k tokens) among them, replayed from
one trace against `tokenmill cluster --replicas 2` (aggregated: 1 thread each, the router
in front) and `--replicas 1 --num-threads 2` (aggregated-1x2), and `--prefill 1 --decode 1`
with --pd-mode always and conditional (variants: a decode worker's prefill budget of 64 or
32 tokens per step; every worker with the default 2 GiB KV pool). Printed per layout: the
short chats' ITL p99 and TTFT p50/p99, the long prompts' TTFT, output throughput, and the
ratios to aggregated.

    python benchmarks/disagg.py [--quick] [--skip-serving] [--out bench-results/disagg]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from benchmarks.router_policies import launch_cluster, stop_cluster  # noqa: E402
from tokenmill.bench.metrics import itl_gaps_s
from tokenmill.bench.record import RequestRecord

BLOCK = 16
SHORT_MAX_TOKENS = 1000  # a prompt below this is a "short chat"


# ------------------------------------------------------------------ part 1: transfer


def kv_shape() -> tuple[int, int]:
    """(layers, floats per block per K or V) of the embedded model."""
    from tokenmill.model.model_files import read_model_info

    arch = read_model_info(None).arch
    return arch.num_hidden_layers, BLOCK * arch.num_key_value_heads * arch.head_dim


def serve_blocks(sizes: list[int], repeats: int, ready, stop) -> None:  # child process
    from tokenmill.kv.connector.params import KVTransferParams
    from tokenmill.kv.connector.producer import KVProducer
    from tokenmill.kv.connector.server import KVBlockServer
    from tokenmill.kv.connector.stats import KVTransferStats
    from tokenmill.kv.manager import KVCacheManager
    from tokenmill.request import Request
    from tokenmill.sampling_params import SamplingParams

    torch.set_num_threads(1)
    layers, numel = kv_shape()
    num_blocks = max(sizes) // BLOCK + 8
    kv_caches = [torch.randn(2, num_blocks, numel) for _ in range(layers)]
    kv = KVCacheManager(num_blocks, BLOCK, enable_caching=True)
    producer = KVProducer(kv, 600.0, KVTransferStats(), lambda: None)
    server = KVBlockServer(producer, kv_caches, "tcp://127.0.0.1:0")
    server.start()
    raw = zmq.Context.instance().socket(zmq.ROUTER)  # the loopback limit: one big frame
    raw_port = raw.bind_to_random_port("tcp://127.0.0.1")
    blob = np.random.bytes(256 << 20)
    ready.put((server.endpoint, f"tcp://127.0.0.1:{raw_port}"))
    rng = random.Random(0)
    while not stop.is_set():
        for n in sizes:  # one transfer at a time: the pool holds the largest only
            for i in range(repeats):
                for carrier in ("tcp", "shm"):
                    tid = f"t{n}-{i}-{carrier}"
                    ids = [rng.randrange(100, 30000) for _ in range(n + 1)]
                    req = Request(tid, ids, SamplingParams(max_tokens=1), [0], n + 8)
                    assert kv.allocate_slots(req, n + 1)
                    req.num_computed_tokens = n + 1
                    producer.register(req, KVTransferParams(tid, do_remote_decode=True))
                    producer.request_finished(req)
                    while producer.active and not stop.is_set():
                        producer.poll()
                        if raw.poll(1):
                            ident, _ = raw.recv_multipart()
                            raw.send_multipart([ident, blob], copy=False)
        while not stop.is_set():
            if raw.poll(10):
                ident, _ = raw.recv_multipart()
                raw.send_multipart([ident, blob], copy=False)
    server.stop()


def transfer_part(sizes: list[int], repeats: int) -> dict:
    from tokenmill.kv.connector.client import pull_blocks
    from tokenmill.kv.hashing import block_hashes

    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=serve_blocks, args=(sizes, repeats, ready, stop), daemon=True)
    child.start()
    endpoint, raw_endpoint = ready.get(timeout=120)
    zctx = zmq.Context()
    results: dict = {"sizes": {}}
    rng = random.Random(0)
    for n in sizes:
        row: dict = {}
        for i in range(repeats):
            for carrier in ("tcp", "shm"):
                ids = [rng.randrange(100, 30000) for _ in range(n + 1)]
                hashes = block_hashes(ids[: (n // BLOCK) * BLOCK], BLOCK)
                t0 = time.perf_counter()
                got = pull_blocks(zctx, endpoint, f"t{n}-{i}-{carrier}", hashes, 0, carrier, 32,
                                  time.monotonic() + 60, threading.Event())  # fmt: skip
                dt = time.perf_counter() - t0
                assert len(got.blocks) == len(hashes), (len(got.blocks), len(hashes))
                row.setdefault(carrier, []).append((dt, got.num_bytes))
        results["sizes"][n] = {
            c: {"seconds": min(t for t, _ in v), "bytes": v[0][1],
                "gbps": v[0][1] / min(t for t, _ in v) / 1e9,
                "ms_per_1k_tokens": 1000 * min(t for t, _ in v) * 1000 / n}
            for c, v in row.items()
        }  # fmt: skip
    # limits, same run: loopback (one 256 MiB frame between the two processes), memcpy
    s = zctx.socket(zmq.DEALER)
    s.connect(raw_endpoint)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        s.send(b"go")
        frame = s.recv(copy=False)
        best = min(best, time.perf_counter() - t0)
    results["loopback_gbps"] = len(frame.buffer) / best / 1e9
    src = torch.randn(64 << 20)
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    results["memcpy_gbps"] = src.numel() * 4 / best / 1e9
    s.close(linger=0)
    stop.set()
    child.join(30)
    zctx.destroy(linger=0)
    return results


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def print_transfer(res: dict) -> None:
    print(f"\nKV transfer (embedded model, float32 KV; limits: memcpy {res['memcpy_gbps']:.2f} GB/s,"
          f" loopback TCP {res['loopback_gbps']:.2f} GB/s)")  # fmt: skip
    print(
        f"{'tokens':>7s} {'MB':>7s} {'carrier':>8s} {'GB/s':>7s} {'ms/1k tok':>10s} {'of limit':>9s}"
    )
    for n, row in res["sizes"].items():
        for carrier, r in row.items():
            limit = res["loopback_gbps"] if carrier == "tcp" else res["memcpy_gbps"]
            print(f"{n:7d} {r['bytes'] / 1e6:7.1f} {carrier:>8s} {r['gbps']:7.2f} "
                  f"{r['ms_per_1k_tokens']:10.1f} {100 * r['gbps'] / limit:8.0f}%")  # fmt: skip


# ------------------------------------------------------------------ part 2: the threshold


def stall_part(lengths: list[int]) -> dict:
    """What prefilling a prompt locally costs a decode worker's streams (one thread): the
    time of the engine step that carries the prefill beside 4 decoding streams, against a
    decode-only step. The remote path costs the transfer of the same blocks instead."""
    from tokenmill import SamplingParams
    from tokenmill.config import CacheConfig, EngineConfig, ModelConfig
    from tokenmill.engine.core import EngineCore
    from tokenmill.messages import EngineCoreRequest

    core = EngineCore(EngineConfig(ModelConfig(), CacheConfig(kv_cache_memory_bytes=1 << 30),
                                   num_threads=1))  # fmt: skip
    rng = random.Random(0)
    decode = SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True)
    for i in range(4):
        ids = [rng.randrange(100, 30000) for _ in range(100)]
        core.add_request(EngineCoreRequest(f"s{i}", ids, decode, time.monotonic()))
    for _ in range(3):
        core.step()  # the streams are decoding now

    def step_s() -> float:
        t0 = time.perf_counter()
        core.step()
        return time.perf_counter() - t0

    base = min(step_s() for _ in range(5))
    out = {"decode_step_ms": 1000 * base, "prefill_step_ms": {}}
    for n in lengths:
        ids = [rng.randrange(100, 30000) for _ in range(n)]
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        core.add_request(EngineCoreRequest(f"p{n}", ids, one, time.monotonic()))
        out["prefill_step_ms"][n] = 1000 * step_s()  # the whole prompt fits one step's budget
        step_s()
    core.shutdown()
    return out


def print_stall(res: dict, transfer: dict | None) -> None:
    print(f"\nlocal prefill on a decode worker (1 thread, 4 streams decoding; a decode-only step "
          f"takes {res['decode_step_ms']:.0f} ms):")  # fmt: skip
    print(f"{'prompt':>7s} {'step ms':>8s} {'streams stall ms':>17s} {'transfer ms (shm)':>18s}")
    per_1k = None
    if transfer:
        per_1k = min(r["shm"]["ms_per_1k_tokens"] for r in transfer["sizes"].values())
    for n, ms in res["prefill_step_ms"].items():
        stall = ms - res["decode_step_ms"]
        moved = f"{per_1k * n / 1000:18.0f}" if per_1k else f"{'-':>18s}"
        print(f"{n:7d} {ms:8.0f} {stall:17.0f} {moved}")


# ------------------------------------------------------------------ part 3: serving


def write_trace(path: Path, args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    rows, t = [], 0.0
    while t < args.duration:
        rows.append({"timestamp": round(t, 3), "input_length": rng.randint(120, 180),
                     "output_length": 64})  # fmt: skip
        t += rng.expovariate(args.chat_rate)
    for k in range(int(args.duration // args.long_every)):
        at = (k + 0.5) * args.long_every
        rows.append({"timestamp": round(at, 3), "input_length": rng.randint(args.long_min, args.long_max),
                     "output_length": 16})  # fmt: skip
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def serve_layout(name: str, flags: list[str], trace: Path, n: int, out: Path) -> dict:
    proc, url = launch_cluster(flags, out / "logs" / name)  # default KV pools (2 GiB each)
    try:
        cmd = [sys.executable, "-m", "tokenmill.cli", "bench", "--base-url", url, "--name", name,
               "--endpoint", "chat", "--workload", "trace", "--dataset", str(trace),
               "--num-requests", str(n), "--load", "trace", "--warmup", "0", "--no-plots",
               "--no-progress", "--output-dir", str(out / name)]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        metrics = httpx.get(url + "/metrics", timeout=10).text
    finally:
        stop_cluster(proc)
    return summarize(out / name / "requests.jsonl", metrics)


def summarize(requests_path: Path, metrics: str) -> dict:
    fields = RequestRecord.__dataclass_fields__
    recs = []
    for line in requests_path.read_text().splitlines():
        row = json.loads(line)
        kw = {k: row[k] for k in fields if k in row and k != "text"}
        kw["chunk_times"], kw["chunk_tokens"] = tuple(kw["chunk_times"]), tuple(kw["chunk_tokens"])
        recs.append(RequestRecord(**kw))
    ok = [r for r in recs if r.success]
    short = [r for r in ok if (r.prompt_tokens or 0) < SHORT_MAX_TOKENS]
    long = [r for r in ok if (r.prompt_tokens or 0) >= SHORT_MAX_TOKENS]
    gaps = [g for r in short for g in itl_gaps_s(r)]
    span = max(r.end_s for r in ok) - min(r.start_s for r in ok)
    decisions = {}
    for line in metrics.splitlines():
        if line.startswith("tokenmill:router_kv_transfer_decisions_total{"):
            label = (
                line.split('decision="')[1].split('"')[0]
                + "/"
                + line.split('reason="')[1].split('"')[0]
            )
            decisions[label] = float(line.rsplit(" ", 1)[1])
    pct = lambda xs, q: float(np.percentile(xs, q)) * 1000 if xs else float("nan")  # noqa: E731
    return {
        "requests": len(recs), "failed": len(recs) - len(ok),
        "short_itl_p50_ms": pct(gaps, 50), "short_itl_p99_ms": pct(gaps, 99),
        "short_ttft_p50_ms": pct([r.ttft_s for r in short if r.ttft_s], 50),
        "short_ttft_p99_ms": pct([r.ttft_s for r in short if r.ttft_s], 99),
        "long_ttft_p50_ms": pct([r.ttft_s for r in long if r.ttft_s], 50),
        "output_tok_s": sum(r.output_tokens or 0 for r in ok) / span,
        "decisions": decisions,
    }  # fmt: skip


def print_serving(runs: dict[str, dict], args: argparse.Namespace) -> None:
    base = runs.get("aggregated") or next(iter(runs.values()))
    print(f"\nmixed workload: short chats at {args.chat_rate}/s (~150 tokens in, 64 out) + one "
          f"{args.long_min}-{args.long_max}-token prompt every {args.long_every:g}s, "
          f"{args.duration:g}s; 2 threads in total per layout")  # fmt: skip
    print(f"{'layout':14s} {'ITL p50':>8s} {'ITL p99':>8s} {'TTFT p50':>9s} {'TTFT p99':>9s} "
          f"{'long TTFT':>10s} {'out tok/s':>9s} {'ITL p99 x':>10s} {'tput x':>7s}  decisions")  # fmt: skip
    for name, r in runs.items():
        print(f"{name:14s} {r['short_itl_p50_ms']:8.0f} {r['short_itl_p99_ms']:8.0f} "
              f"{r['short_ttft_p50_ms']:9.0f} {r['short_ttft_p99_ms']:9.0f} {r['long_ttft_p50_ms']:10.0f} "
              f"{r['output_tok_s']:9.1f} {base['short_itl_p99_ms'] / r['short_itl_p99_ms']:9.2f}x "
              f"{r['output_tok_s'] / base['output_tok_s']:6.2f}x  "
              f"{', '.join(f'{k} {v:.0f}' for k, v in r['decisions'].items())}"
              f"{' (' + str(r['failed']) + ' failed)' if r['failed'] else ''}")  # fmt: skip


def split_layout(mode: str, decode_budget: int | None = None) -> list[str]:
    """1 prefill + 1 decode worker; a decode budget caps the tokens the decode worker
    prefills per step (its streams wait for no more), the prefill worker keeps 2048."""
    flags = ["--prefill", "1", "--decode", "1", "--pd-mode", mode]
    if decode_budget:
        flags += ["--decode-args", f"--max-num-batched-tokens {decode_budget}"]
    return flags


LAYOUTS = {
    "aggregated": ["--replicas", "2"],
    "aggregated-1x2": ["--replicas", "1", "--num-threads", "2"],
    "disagg-always": split_layout("always"),
    "disagg-cond": split_layout("conditional"),
    "disagg-cond-c64": split_layout("conditional", 64),
    "aggregated-c64": ["--replicas", "2", "--max-num-batched-tokens", "64"],
    "disagg-always-c64": split_layout("always", 64),
    "disagg-cond-c32": split_layout("conditional", 32),
    "aggregated-c32": ["--replicas", "2", "--max-num-batched-tokens", "32"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--quick", action="store_true", help="a short smoke run")
    ap.add_argument("--skip-serving", action="store_true")
    ap.add_argument("--skip-transfer", action="store_true")
    ap.add_argument("--skip-stall", action="store_true")
    ap.add_argument("--duration", type=float, default=240.0, help="trace length, s")
    ap.add_argument("--chat-rate", type=float, default=1.0, help="short chats per second")
    ap.add_argument("--long-every", type=float, default=30.0, help="one long prompt per S")
    ap.add_argument("--long-min", type=int, default=2000)
    ap.add_argument("--long-max", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="which layouts to serve")
    results_file.add_arguments(ap)
    args = ap.parse_args()
    sizes, repeats = [1024, 4096, 8192], 3
    if args.quick:
        args.duration, args.long_every, args.long_max = 40.0, 20.0, 3000
        sizes, repeats = [1024], 1
    out = Path(args.out or tempfile.mkdtemp(prefix="disagg-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    tables: list[str] = []  # what is printed below, for the results file
    if not args.skip_transfer:
        summary["transfer"] = transfer_part(sizes, repeats)
        with results_file.printed() as table:
            print_transfer(summary["transfer"])
        tables.append(table.getvalue())
    if not args.skip_stall:
        summary["stall"] = stall_part([32, 64, 128, 512, 2048])
        with results_file.printed() as table:
            print_stall(summary["stall"], summary.get("transfer"))
        tables.append(table.getvalue())
    if not args.skip_serving:
        trace = out / "mixed-trace.jsonl"
        write_trace(trace, args)
        n = sum(1 for _ in trace.open())
        summary["serving"] = {name: serve_layout(name, LAYOUTS[name], trace, n, out)
                              for name in args.layouts.split(",")}  # fmt: skip
        with results_file.printed() as table:
            print_serving(summary["serving"], args)
        tables.append(table.getvalue())
    results_file.write("disagg", results_file.text_block("".join(tables)), args)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
