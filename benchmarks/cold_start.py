"""Cold start: from launch to a served first token, tokenmill beside llama-server on the same
GGUF file, in one run.

    .venv/bin/python benchmarks/cold_start.py [--rounds N] [--threads N] [--markdown PATH]
        [--skip-llama-cpp] [--skip-offline]

Servers (the embedded model, SmolLM2-135M-Instruct Q4_1; the systems take turns, round by
round, so drift on a shared machine hits both)
    tokenmill       `tokenmill serve` (defaults)
    no warm-up      `tokenmill serve --no-warm-up`: what the warm-up request buys
    llama-server    llama.cpp's server on the same file (-t THREADS, one slot)

Numbers per launch (median over the rounds, min..max beside it)
    ready           launch -> the first 200 from /health (polled every 10 ms)
    first token     launch -> the first streamed token of the first request
    TTFT 1st/10th   time to first token of the first request and of the tenth; each request
                    is a different ~40-token completion prompt (no prefix-cache hits), 8
                    output tokens, greedy
Offline (tokenmill only)
    LLM()           `LLM()` construction in a fresh interpreter, imports included
    generate        `tokenmill generate` launch -> its first output byte

Targets (issue 19): ready <= 3 s, first token <= 3.5 s and <= 4x llama-server's, first
request TTFT <= 1.5x the tenth's. tokenmill's own start-up profile (/server_info) is printed
for the last round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import results as results_file  # noqa: E402
from tokenmill.bench.peers import find_llama_server, free_port  # noqa: E402
from tokenmill.model.embedded import embedded_model_path  # noqa: E402

log = Console(stderr=True, highlight=False)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
WORDS = [
    "amber",
    "bridge",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "granite",
    "harbor",
    "island",
    "jasmine",
    "kettle",
    "lantern",
    "meadow",
    "nickel",
    "orchard",
    "pepper",
    "quartz",
    "river",
    "saffron",
    "timber",
]
PROMPT = "{word}: write one sentence about a {word} you saw this morning near the old mill."


@dataclass
class Launch:
    ready: float
    first_token: float
    ttft: list[float]
    profile: dict | None = None


@dataclass
class SystemRuns:
    name: str
    launches: list[Launch] = field(default_factory=list)


# One client for the whole run: a fresh httpx client per /health poll builds an SSL context
# (~15 ms of CPU), which every 10 ms took most of a core from the server starting beside it.
CLIENT = httpx.Client(timeout=120)


def stream_first_token(base: str, model: str, prompt: str) -> float:
    """Seconds to the first streamed token of a greedy completion."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "stream": True,
        "ignore_eos": True,
    }  # fmt: skip
    start = time.monotonic()
    with CLIENT.stream("POST", f"{base}/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            if json.loads(line[5:]).get("choices"):  # the first token's chunk
                return time.monotonic() - start
    raise RuntimeError("the stream ended without a token")


def launch(cmd: list[str], base: str, model: str, log_path: Path, want_profile: bool) -> Launch:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as logf:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[0]} exited:\n{log_path.read_text()[-2000:]}")
            if time.monotonic() - start > 300:
                raise RuntimeError(f"{cmd[0]} not ready in 300 s")
            try:
                if CLIENT.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        ready = time.monotonic() - start
        ttft = [stream_first_token(base, model, PROMPT.format(word=WORDS[0]))]
        first_token = time.monotonic() - start
        ttft += [stream_first_token(base, model, PROMPT.format(word=w)) for w in WORDS[1:10]]
        profile = None
        if want_profile:
            profile = CLIENT.get(f"{base}/server_info", timeout=10).json().get("startup")
        return Launch(ready, first_token, ttft, profile)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def offline_llm(threads: int) -> float:
    code = (
        "import time; t = time.monotonic(); from tokenmill import LLM; "
        f"LLM(num_threads={threads}); print(time.monotonic() - t)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    return float(done.stdout.strip().splitlines()[-1])


def offline_generate(threads: int) -> float:
    cmd = [
        sys.executable, "-m", "tokenmill.cli", "generate", "Once upon a time",
        "--max-tokens", "4", "--temperature", "0", "--num-threads", str(threads),
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    elapsed = time.monotonic() - start
    proc.wait(120)
    if not first:
        raise RuntimeError("tokenmill generate printed nothing")
    return elapsed


def med(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float], unit: float = 1.0, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(med(values) * unit)} ({fmt.format(min(values) * unit)}..{fmt.format(max(values) * unit)})"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--markdown", default=None, metavar="PATH")
    ap.add_argument("--skip-llama-cpp", action="store_true")
    ap.add_argument("--skip-offline", action="store_true")
    results_file.add_arguments(ap)
    args = ap.parse_args()
    model_path = embedded_model_path()
    logs = Path(tempfile.mkdtemp(prefix="tokenmill-cold-start-"))
    systems = [SystemRuns("tokenmill"), SystemRuns("tokenmill --no-warm-up")]
    llama = None if args.skip_llama_cpp else find_llama_server()
    if llama is None and not args.skip_llama_cpp:
        log.print(
            "[yellow]llama-server not found (benchmarks/peers/build_llama_cpp.sh): skipped[/]"
        )
    if llama is not None:
        systems.append(SystemRuns("llama-server"))
    offline: dict[str, list[float]] = {"LLM()": [], "generate": []}
    for rnd in range(args.rounds):
        for system in systems:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            if system.name.startswith("tokenmill"):
                cmd = [
                    sys.executable, "-m", "tokenmill.cli", "serve", "--port", str(port),
                    "--num-threads", str(args.threads), *system.name.split()[1:],
                ]  # fmt: skip
                model = "SmolLM2-135M-Instruct"
            else:
                cmd = [
                    str(llama), "-m", str(model_path), "--port", str(port), "-t",
                    str(args.threads), "-np", "1", "-c", "8192",
                ]  # fmt: skip
                model = model_path.name
            result = launch(
                cmd,
                base,
                model,
                logs / f"{system.name.replace(' ', '')}-{rnd}.log",
                system.name == "tokenmill",
            )
            system.launches.append(result)
            log.print(
                f"round {rnd + 1} {system.name}: ready {result.ready:.2f} s, first token "
                f"{result.first_token:.2f} s, TTFT 1st {result.ttft[0] * 1000:.0f} ms / 10th "
                f"{result.ttft[-1] * 1000:.0f} ms"
            )
        if not args.skip_offline:
            offline["LLM()"].append(offline_llm(args.threads))
            offline["generate"].append(offline_generate(args.threads))
            log.print(f"round {rnd + 1} offline: LLM() {offline['LLM()'][-1]:.2f} s, generate "
                      f"first byte {offline['generate'][-1]:.2f} s")  # fmt: skip
    report(systems, offline, args)
    return 0


def report(systems: list[SystemRuns], offline: dict[str, list[float]], args) -> None:
    table = Table(title=f"cold start, embedded model (Q4_1), {args.threads} threads, "
                  f"median of {args.rounds} launches (min..max)")  # fmt: skip
    for col in ("system", "ready s", "first token s", "TTFT 1st ms", "TTFT 10th ms", "1st/10th"):
        table.add_column(col, justify="left" if col == "system" else "right")
    rows = []
    for s in systems:
        ready = [x.ready for x in s.launches]
        first = [x.first_token for x in s.launches]
        t1 = [x.ttft[0] for x in s.launches]
        t10 = [x.ttft[-1] for x in s.launches]
        ratio = med(t1) / med(t10)
        row = [s.name, spread(ready), spread(first), spread(t1, 1000, "{:.0f}"),
               spread(t10, 1000, "{:.0f}"), f"{ratio:.2f}x"]  # fmt: skip
        table.add_row(*row)
        rows.append(row)
    out.print(table)
    tm = systems[0]
    lines = []
    peers = [s for s in systems if s.name == "llama-server"]
    if peers:
        peer = peers[0]
        ratio = med([x.first_token for x in tm.launches]) / med(
            [x.first_token for x in peer.launches]
        )
        lines.append(
            f"launch -> first token: tokenmill / llama-server = {ratio:.2f}x (target <= 4x)"
        )
    lines.append(
        f"targets: ready {med([x.ready for x in tm.launches]):.2f} s (<= 3), first token "
        f"{med([x.first_token for x in tm.launches]):.2f} s (<= 3.5)"
    )
    for name, values in offline.items():
        if values:
            lines.append(f"offline {name}: {spread(values)} s")
    for line in lines:
        out.print(line)
    profile = tm.launches[-1].profile or {}
    for proc, prof in profile.items():
        if prof:
            phases = ", ".join(f"{p['name']} {p['seconds']:.2f}" for p in prof["phases"])
            out.print(f"tokenmill {proc} start-up ({prof['total_s']:.2f} s): {phases}")
    md = ["| " + " | ".join(c.header for c in table.columns) + " |",
          "| --- |" + " ---: |" * (len(table.columns) - 1)]  # fmt: skip
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", *lines]
    if args.markdown:
        Path(args.markdown).write_text("\n".join(md) + "\n")
    results_file.write("cold-start", "\n".join(md), args, title=table.title)


if __name__ == "__main__":
    sys.exit(main())
