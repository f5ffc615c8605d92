"""What a running batch costs interactive users: TTFT p50 at 8 concurrent users, measured
with `tokenmill bench`, without and with a large Batch API batch running on the same server.
Rounds alternate (idle, batch, idle, batch, ...) so that load from elsewhere on a shared
machine falls on both conditions; the medians of the rounds and their ratio are printed,
with the batch lines finished during the measured windows (the throughput it keeps).

    python benchmarks/batch_interference.py [--rounds 3] [--tokenmill-args "--batch-busy-in-flight 2"]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.bench.compare import default_model  # noqa: E402
from tokenmill.bench.peers import ManagedServer, tokenmill_spec  # noqa: E402

CHAT = "/v1/chat/completions"


def bench(url: str, out: Path, args: argparse.Namespace) -> float:
    """TTFT p50 (ms) of one `tokenmill bench` run at --concurrency users."""
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "bench", "--base-url", url, "--load", "concurrency",
        "--concurrency", str(args.concurrency), "--num-requests", str(args.num_requests),
        "--input-len", str(args.input_len), "--output-len", str(args.output_len),
        "--warmup", "0", "--no-plots", "--no-progress", "--output-dir", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    return run["summary"]["ttft_ms"]["median"]


def batch_file(lines: int, model: str) -> bytes:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    body = []
    for i in range(lines):
        prompt = " ".join(words[(i + j) % len(words)] for j in range(120))
        req = {
            "model": model, "messages": [{"role": "user", "content": f"{i}: {prompt}"}],
            "max_tokens": 64, "ignore_eos": True, "temperature": 0,
        }  # fmt: skip
        body.append(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": CHAT, "body": req}))
    return ("\n".join(body) + "\n").encode()


def start_batch(v1: str, file_id: str) -> str:
    r = httpx.post(
        f"{v1}/batches",
        json={"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"},
        timeout=60,
    )
    r.raise_for_status()
    batch_id = r.json()["id"]
    while httpx.get(f"{v1}/batches/{batch_id}", timeout=60).json()["status"] == "validating":
        time.sleep(0.2)
    time.sleep(2.0)  # its lines are in the engine
    return batch_id


def stop_batch(v1: str, batch_id: str) -> int:
    """Cancels it; the lines it finished."""
    httpx.post(f"{v1}/batches/{batch_id}/cancel", timeout=60).raise_for_status()
    while (b := httpx.get(f"{v1}/batches/{batch_id}", timeout=60).json())["status"] != "cancelled":
        time.sleep(0.2)
    return b["request_counts"]["completed"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--batch-lines", type=int, default=2000)
    p.add_argument("--tokenmill-args", default="", help="extra serve flags")
    p.add_argument("--model", default=None)
    results_file.add_arguments(p)
    args = p.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="batch-interference-"))
    extra = f"--batch-store {tmp / 'db.sqlite3'} --response-store off {args.tokenmill_args}"
    spec = tokenmill_spec("tokenmill", args.model or default_model(), extra)
    with ManagedServer(spec, tmp) as server:
        v1 = f"{server.base_url}/v1"
        model = httpx.get(f"{v1}/models").json()["data"][0]["id"]
        upload = httpx.post(
            f"{v1}/files",
            files={"file": ("big.jsonl", batch_file(args.batch_lines, model))},
            data={"purpose": "batch"},
            timeout=120,
        )
        upload.raise_for_status()
        file_id = upload.json()["id"]
        bench(server.base_url, tmp / "warm", args)  # first requests pay one-time costs
        idle, busy, done, seconds = [], [], 0, 0.0
        for r in range(args.rounds):
            idle.append(bench(server.base_url, tmp / f"idle{r}", args))
            batch_id = start_batch(v1, file_id)
            t0 = time.monotonic()
            busy.append(bench(server.base_url, tmp / f"busy{r}", args))
            seconds += time.monotonic() - t0
            done += stop_batch(v1, batch_id)
            print(f"round {r}: TTFT p50 idle {idle[-1]:.1f} ms, with a batch {busy[-1]:.1f} ms "
                  f"({busy[-1] / idle[-1]:.2f}x)", flush=True)  # fmt: skip
    a, b = statistics.median(idle), statistics.median(busy)
    with results_file.capture("batch-interference", args):
        _summary(args, a, b, done, seconds)


def _summary(args: argparse.Namespace, a: float, b: float, done: int, seconds: float) -> None:
    print(f"\nTTFT p50 at {args.concurrency} users (median of {args.rounds} rounds):")
    print(f"  without a batch  {a:8.1f} ms")
    print(f"  with a batch     {b:8.1f} ms")
    print(f"  ratio            {b / a:8.2f}x  (target <= 1.20)")
    print(f"  batch lines finished meanwhile: {done} in {seconds:.0f} s "
          f"({done / max(seconds, 1e-9):.2f} lines/s)")  # fmt: skip


if __name__ == "__main__":
    main()
