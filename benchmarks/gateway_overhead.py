"""What the gateway costs: `tokenmill bench` at 32 users against the same server with and
without `--gateway-config` (API key + limits + budget + the usage ledger + every
deterministic guardrail on input and output), taking turns, one server at a time.

    .venv/bin/python benchmarks/gateway_overhead.py [--rounds 3] [--concurrency 32]
        [--num-requests 96] [--input-len 256] [--output-len 64] [--markdown PATH]

Targets (issue 14): output tok/s within 3% and p50 TTFT within 5 ms of the server without
the gateway. Prompts are words (not token ids), so the input guardrails scan real text; the
chat endpoint, streamed with continuous usage (the bench's own settings).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.server.conftest import free_port  # noqa: E402

ADMIN = "admin-bench-" + "z" * 32
GUARDRAILS = {
    "rules": [
        {"name": "secrets", "scanner": "secrets", "action": "block"},
        {"name": "pii", "scanner": "pii", "action": "redact"},
        {"name": "invisible", "scanner": "invisible", "action": "block"},
        {"name": "injection", "scanner": "injection", "action": "audit"},
        {"name": "deny", "scanner": "deny_list", "terms": ["acme corp", "project zebra"],
         "action": "fallback", "fallback": "I can't discuss that."},
        {"name": "length", "scanner": "length", "max_chars": 200000, "action": "block"},
    ]
}  # fmt: skip


def gateway_config(tmp: Path) -> Path:
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "database": str(tmp / "gateway.sqlite3"),
        "journal": str(tmp / "journal"),
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "prices": {"default": {"input": 0.1, "cached_input": 0.05, "output": 0.4}},
        "guardrails": GUARDRAILS,
    }))  # fmt: skip
    return path


def start(tmp: Path, gateway: Path | None, max_num_seqs: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "tokenmill.cli", "serve", "--port", str(port),
           "--max-num-seqs", str(max_num_seqs), "--response-store", "off"]  # fmt: skip
    if gateway is not None:
        cmd += ["--gateway-config", str(gateway)]
    log = open(tmp / f"server-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise RuntimeError(f"server did not start: {(tmp / f'server-{port}.log').read_text()[-2000:]}")


def bench(url: str, key: str | None, args, out: Path, seed: int) -> dict:
    cmd = [sys.executable, "-m", "tokenmill.cli", "bench", "--base-url", url, "--endpoint", "chat",
           "--concurrency", str(args.concurrency), "--num-requests", str(args.num_requests),
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--prompt-source", "words", "--seed", str(seed), "--output-dir", str(out),
           "--no-plots", "--no-progress", "--served-model", "SmolLM2-135M-Instruct"]  # fmt: skip
    if key:
        cmd += ["--api-key", key]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    run = json.loads((out / "results.json").read_text())["runs"][-1]
    s = run["summary"]
    return {
        "out_tps": s["output_throughput"],
        "ttft_p50_ms": s["ttft_ms"]["median"],
        "tpot_p50_ms": s["tpot_ms"]["median"],
        "failed": s["failed"],
        "background": run.get("background_cpu_cores"),
    }


def admission_ms(url: str) -> float:
    """Mean time a request spent in the gateway before reaching the model (its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        if line.startswith("tokenmill:gateway_admission_seconds_"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    count = values.get("tokenmill:gateway_admission_seconds_count", 0.0)
    return 1000 * values.get("tokenmill:gateway_admission_seconds_sum", 0.0) / max(count, 1.0)


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--markdown", default=None)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tokenmill-gateway-bench-"))
    config = gateway_config(tmp)
    env = {**os.environ}
    made = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "keys", "create", "--gateway-config", str(config),
         "--name", "bench", "--rpm", "1000000", "--tpm", "1000000000", "--max-parallel", "1000",
         "--budget-usd", "1000000", "--budget-period", "day"],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    key = json.loads(made.stdout)["key"]
    results: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(args.rounds):
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        for system in order:
            proc, url = start(tmp, config if system == "on" else None, args.concurrency)
            try:
                res = bench(
                    url, key if system == "on" else None, args, tmp / f"{system}-{r}", seed=1000 + r
                )
                if system == "on":
                    res["admission_ms"] = admission_ms(url)
            finally:
                proc.terminate()
                proc.wait(60)
            results[system].append(res)
            extra = (f", {res['admission_ms']:.2f} ms/request in the gateway before the model"
                     if "admission_ms" in res else "")  # fmt: skip
            print(f"round {r + 1} {system:>3}: {res['out_tps']:.1f} out tok/s, TTFT p50 "
                  f"{res['ttft_p50_ms']:.1f} ms, TPOT p50 {res['tpot_p50_ms']:.1f} ms, "
                  f"failed {res['failed']}{extra}", flush=True)  # fmt: skip
    med = {s: {k: statistics.median(x[k] for x in v) for k in ("out_tps", "ttft_p50_ms", "tpot_p50_ms")}
           for s, v in results.items()}  # fmt: skip
    from tokenmill.gateway.store.database import open_database

    rows = open_database(str(tmp / "gateway.sqlite3")).fetchone("SELECT COUNT(*) FROM usage")[0]
    tps_ratio = med["on"]["out_tps"] / med["off"]["out_tps"]
    ttft_delta = med["on"]["ttft_p50_ms"] - med["off"]["ttft_p50_ms"]
    lines = [
        f"Gateway overhead, {args.concurrency} users, chat, in {args.input_len} / out {args.output_len} "
        f"words-prompt tokens, {args.num_requests} requests per run, median of {args.rounds} rounds",
        "",
        "| | output tok/s | TTFT p50 ms | TPOT p50 ms |",
        "|---|---:|---:|---:|",
        f"| gateway off | {med['off']['out_tps']:.1f} | {med['off']['ttft_p50_ms']:.1f} | {med['off']['tpot_p50_ms']:.1f} |",
        f"| gateway on | {med['on']['out_tps']:.1f} | {med['on']['ttft_p50_ms']:.1f} | {med['on']['tpot_p50_ms']:.1f} |",
        "",
        f"output tok/s on/off: {tps_ratio:.3f} (target >= 0.97: {'met' if tps_ratio >= 0.97 else 'NOT met'}); "
        f"TTFT p50 on - off: {ttft_delta:+.1f} ms (target <= 5 ms: {'met' if ttft_delta <= 5 else 'NOT met'}); "
        f"ledger rows: {rows} (requests sent with the gateway on, warm-up included); time in the "
        f"gateway before the model: {statistics.median(x['admission_ms'] for x in results['on']):.2f} "
        "ms per request (its /metrics)",
    ]  # fmt: skip
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
