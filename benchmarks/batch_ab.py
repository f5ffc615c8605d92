"""Batched greedy generation, this checkout against others, in alternating rounds of one run.

    .venv/bin/python benchmarks/batch_ab.py --checkout DIR [--checkout DIR ...] [--rounds 3]
        [--requests 64] [--prompt 128] [--gen 128] [--engine-arg KEY=VALUE ...]

Each system is a fresh process per round that imports `tokenmill` from its checkout (this one,
then every DIR: another version's working tree, e.g. `git worktree add /tmp/base <commit>`)
and runs one LLM.generate call of `--requests` random-token prompts of `--prompt` tokens with
`--gen` greedy output tokens each (EOS ignored) on the embedded model, after a warm-up call.
Rates: total = (prompt + output tokens) / the call's time, as llama-batched-bench's S; each
system's best round is kept (a busy moment only slows a run down)."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]


def engine_args(pairs: list[str]) -> dict[str, object]:
    """KEY=VALUE pairs as LLM() keyword arguments (ints and floats parsed, else strings)."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--engine-arg {pair!r}: expected KEY=VALUE")
        value: object = raw
        for kind in (int, float):
            try:
                value = kind(raw)
                break
            except ValueError:
                pass
        out[key.replace("-", "_")] = value
    return out


def worker(args: argparse.Namespace) -> None:
    """One system's round, in its own process: prints one JSON line."""
    from tokenmill import LLM, SamplingParams

    llm = LLM(None, num_threads=args.threads, **engine_args(args.engine_arg))
    rng = random.Random(args.seed)

    def prompts(n: int) -> list[dict]:
        return [
            {"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(args.prompt)]}
            for _ in range(n)
        ]

    llm.generate(prompts(4), SamplingParams(temperature=0, max_tokens=8))  # warm-up
    params = SamplingParams(
        temperature=0, max_tokens=args.gen, min_tokens=args.gen, ignore_eos=True
    )
    start = time.perf_counter()
    outs = llm.generate(prompts(args.requests), params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    assert generated == args.requests * args.gen, generated
    total = args.requests * args.prompt + generated
    print(json.dumps({"total": total / elapsed, "seconds": elapsed}))


def run_round(checkout: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(HERE), "--worker", "--requests", str(args.requests)]
    cmd += ["--prompt", str(args.prompt), "--gen", str(args.gen), "--threads", str(args.threads)]
    cmd += ["--seed", str(args.seed)]
    for pair in args.engine_arg:
        cmd += ["--engine-arg", pair]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{checkout}: the worker failed\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--checkout", type=Path, action="append", default=[], metavar="DIR")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    sys.path.insert(0, str(REPO))
    from benchmarks import results as results_file

    results_file.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    systems = [REPO, *(c.resolve() for c in args.checkout)]
    for c in systems:
        if not (c / "tokenmill" / "__init__.py").is_file():
            raise SystemExit(f"{c}: no tokenmill package there")
    rows: dict[Path, list[float]] = {c: [] for c in systems}
    for r in range(args.rounds):
        for c in systems:
            rate = run_round(c, args)["total"]
            rows[c].append(rate)
            print(f"round {r + 1}: {c}: {rate:,.0f} tok/s", file=sys.stderr, flush=True)
    this = max(rows[REPO])
    with results_file.capture("batch-ab", args):
        print(
            f"{args.requests} x ({args.prompt} + {args.gen}) greedy, one LLM.generate call, "
            f"{args.threads} threads, engine args {engine_args(args.engine_arg) or 'defaults'}; "
            f"total tok/s per round, alternating"
        )
        rounds = " | ".join(f"round {i + 1}" for i in range(args.rounds))
        print(f"| checkout | commit | {rounds} | best | vs this |")
        print("| --- | --- | " + " | ".join("---:" for _ in range(args.rounds + 2)) + " |")
        for c, rates in rows.items():
            cells = " | ".join(f"{x:,.0f}" for x in rates)
            best = max(rates)
            print(f"| {c} | {commit(c)} | {cells} | {best:,.0f} | {best / this:.2f}x |")
    return 0


def commit(checkout: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
