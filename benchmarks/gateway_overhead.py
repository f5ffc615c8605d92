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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tests.server.conftest import free_port  # noqa: E402

ADMIN = "admin-bench-" + "z" * 32
INPUT_RULES = [
    {"name": "secrets", "scanner": "secrets", "action": "block"},
    {"name": "pii", "scanner": "pii", "action": "redact"},
    {"name": "invisible", "scanner": "invisible", "action": "block"},
    {"name": "injection", "scanner": "injection", "action": "audit"},
    {"name": "deny", "scanner": "deny_list", "terms": ["acme corp", "project zebra"],
     "action": "fallback", "fallback": "I can't discuss that."},
    {"name": "length", "scanner": "length", "max_chars": 200000, "action": "block"},
]  # fmt: skip
# "on": every deterministic scanner on the input; on the output the same scanners, audited
# (recorded with the matched text, the text unchanged: nothing is held back)
AUDITED_OUTPUT = [
    {**{k: v for k, v in r.items() if k not in ("action", "fallback")}, "name": f"out-{r['name']}",
     "action": "audit", "stages": ["output"]}
    for r in INPUT_RULES
]  # fmt: skip
# "on+output": output rules that change text: the streamed output is held back until it
# cannot be part of a match (at most hold_back_chars)
CHANGING_OUTPUT = [
    {"name": "out-secrets", "scanner": "secrets", "action": "block", "stages": ["output"]},
    {"name": "out-pii", "scanner": "pii", "action": "redact", "stages": ["output"]},
    {"name": "out-deny", "scanner": "deny_list", "terms": ["acme corp"], "action": "fallback",
     "fallback": "I can't discuss that.", "stages": ["output"]},
]  # fmt: skip
SYSTEMS = {
    "off": None,
    "on": [{**r, "stages": ["input"]} for r in INPUT_RULES] + AUDITED_OUTPUT,
    "on+output": [{**r, "stages": ["input"]} for r in INPUT_RULES] + CHANGING_OUTPUT,
}


def gateway_config(tmp: Path, name: str, rules: list[dict]) -> Path:
    path = tmp / f"gateway-{name}.yaml"
    path.write_text(yaml.safe_dump({
        "database": str(tmp / f"gateway-{name}.sqlite3"),
        "journal": str(tmp / f"journal-{name}"),
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "prices": {"default": {"input": 0.1, "cached_input": 0.05, "output": 0.4}},
        "guardrails": {"rules": rules},
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
    subprocess.run(cmd, stdout=subprocess.DEVNULL)  # exit 3: some requests failed (reported)
    run = json.loads((out / "results.json").read_text())["runs"][-1]
    s = run["summary"]
    return {
        "out_tps": s["output_throughput"],
        "ttft_p50_ms": s["ttft_ms"]["median"],
        "tpot_p50_ms": s["tpot_ms"]["median"],
        "failed": s["failed"],
        "background": run.get("background_cpu_cores"),
    }


def admission_ms(url: str) -> tuple[float, float]:
    """Time a request spent in the gateway before reaching the model (its /metrics histogram):
    the mean, and the upper bound of the bucket holding the median."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    total = count = 0.0
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if not line.startswith("tokenmill:gateway_admission_seconds_"):
            continue
        name, value = line.rsplit(" ", 1)
        if name.startswith("tokenmill:gateway_admission_seconds_sum"):
            total = float(value)
        elif name.startswith("tokenmill:gateway_admission_seconds_count"):
            count = float(value)
        elif "_bucket" in name:
            le = name.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(value)))
    median = next((le for le, n in sorted(buckets) if n >= count / 2), float("nan"))
    return 1000 * total / max(count, 1.0), 1000 * median


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=96)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--markdown", default=None)
    p.add_argument(
        "--systems", default=",".join(SYSTEMS), help="comma-separated, of: " + ", ".join(SYSTEMS)
    )
    results_file.add_arguments(p)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tokenmill-gateway-bench-"))
    configs = {name: gateway_config(tmp, name, rules) for name, rules in SYSTEMS.items() if rules}
    configs = {name: c for name, c in configs.items() if name in args.systems.split(",")}
    keys = {}
    for name, config in configs.items():  # one database per system: rows are counted apart
        made = subprocess.run(
            [sys.executable, "-m", "tokenmill.cli", "keys", "create", "--gateway-config", str(config),
             "--name", "bench", "--rpm", "1000000", "--tpm", "1000000000", "--max-parallel", "1000",
             "--budget-usd", "1000000", "--budget-period", "day"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        keys[name] = json.loads(made.stdout)["key"]
    names = [n for n in args.systems.split(",") if n]
    if "off" not in names or any(n not in SYSTEMS for n in names):
        raise SystemExit(f"--systems: off and any of {', '.join(SYSTEMS)}")
    results: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # each system first once
        for system in order:
            config = configs.get(system)
            proc, url = start(tmp, config, args.concurrency)
            try:
                res = bench(url, keys.get(system), args, tmp / f"{system}-{r}", seed=1000 + r)
                if config is not None:
                    res["admission_ms"], res["admission_p50_ms"] = admission_ms(url)
            finally:
                proc.terminate()
                proc.wait(60)
            results[system].append(res)
            extra = (f", in the gateway before the model: mean {res['admission_ms']:.2f} ms, "
                     f"p50 <= {res['admission_p50_ms']:g} ms" if "admission_ms" in res else "")  # fmt: skip
            print(f"round {r + 1} {system:>9}: {res['out_tps']:.1f} out tok/s, TTFT p50 "
                  f"{res['ttft_p50_ms']:.1f} ms, TPOT p50 {res['tpot_p50_ms']:.1f} ms, "
                  f"failed {res['failed']}{extra}", flush=True)  # fmt: skip
    keys_ = ("out_tps", "ttft_p50_ms", "tpot_p50_ms")
    med = {s: {k: statistics.median(x[k] for x in v) for k in keys_} for s, v in results.items()}
    from tokenmill.gateway.store.database import open_database

    lines = [
        f"Gateway overhead: {args.concurrency} users, chat (streamed), ~{args.input_len}-token word "
        f"prompts, {args.output_len} output tokens, {args.num_requests} requests per run, "
        f"median of {args.rounds} rounds (systems take turns, one server at a time)",
        "",
        "| system | output tok/s | vs off | TTFT p50 ms | vs off | TTFT p50 by round | TPOT p50 ms | gateway before the model: mean / p50 ms | ledger rows |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|",
    ]  # fmt: skip
    base = med["off"]
    for name in names:
        m = med[name]
        rows = ""
        adm = ""
        if name in configs:
            db = open_database(str(tmp / f"gateway-{name}.sqlite3"))
            rows = str(db.fetchone("SELECT COUNT(*) FROM usage")[0])
            adm = (f"{statistics.median(x['admission_ms'] for x in results[name]):.2f} / "
                   f"<= {max(x['admission_p50_ms'] for x in results[name]):g}")  # fmt: skip
        by_round = " / ".join(f"{x['ttft_p50_ms']:.0f}" for x in results[name])
        lines.append(
            f"| {name} | {m['out_tps']:.1f} | {m['out_tps'] / base['out_tps']:.3f}x | "
            f"{m['ttft_p50_ms']:.0f} | {m['ttft_p50_ms'] - base['ttft_p50_ms']:+.0f} | "
            f"{by_round} | "
            f"{m['tpot_p50_ms']:.1f} | {adm} | {rows} |"
        )
    on = med.get("on", base)
    ratio, delta = on["out_tps"] / base["out_tps"], on["ttft_p50_ms"] - base["ttft_p50_ms"]
    lines += [
        "",
        f"targets (gateway on: keys, limits, budget, ledger, deterministic guardrails): output "
        f"tok/s >= 0.97x off: {ratio:.3f}x {'met' if ratio >= 0.97 else 'NOT met'}; TTFT p50 "
        f"<= off + 5 ms: {delta:+.0f} ms {'met' if delta <= 5 else 'NOT met'}",
    ]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
    results_file.write("gateway-overhead", "\n".join(lines), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
