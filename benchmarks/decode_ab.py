"""Single-stream decode of the embedded model's native weights at each activation precision
of the integer-dot kernels (`int_dot_activation_bits`), next to llama-bench tg (Q4_1) where
it is built, in alternating rounds of one run; each system's best rate (a busy moment only
slows a run down).

    .venv/bin/python benchmarks/decode_ab.py [--rounds 3] [--tokens 128] [--threads N]

Decode rate: the output tokens after the first over the time after the first (the prompt's
prefill and first token subtracted: a run of max_tokens=1 on the same prompt)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import MODEL_STEM, llama_cpp_dirs  # noqa: E402

BITS = (16, 24, 8)  # the default first
PEER = "Q4_1"  # the embedded file's format


def llama_bench_tg(threads: int, tokens: int) -> float | None:
    bin_dir, models = llama_cpp_dirs()
    model = models / f"{MODEL_STEM}.{PEER}.gguf"
    if not (bin_dir / "llama-bench").is_file() or not model.is_file():
        return None
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "0"]
    out = subprocess.run(
        [*cmd, "-n", str(tokens), "-r", "3", "-o", "json"], capture_output=True, text=True
    )
    return max(json.loads(out.stdout)[0]["samples_ts"]) if out.returncode == 0 else None


def decode_rate(llm, prompt: list[int], tokens: int) -> float:
    from tokenmill import SamplingParams

    def run(n: int) -> float:  # min_tokens: no stop (a loop cut off) before n
        params = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)
        start = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
        elapsed = time.perf_counter() - start
        assert len(out.outputs[0].token_ids) == n, len(out.outputs[0].token_ids)
        return elapsed

    first = run(1)
    return (tokens - 1) / (run(tokens) - first)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    results_file.add_arguments(ap)
    args = ap.parse_args(argv)
    from tokenmill import LLM

    llms = {
        f"tokenmill native, {bits}-bit activations": LLM(
            None, kv_cache_memory_gib=0.5, num_threads=args.threads, int_dot_activation_bits=bits
        )
        for bits in BITS
    }
    prompt = [(37 * i) % 30000 + 100 for i in range(16)]
    for llm in llms.values():  # warm-up
        decode_rate(llm, prompt, 16)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        rate = llama_bench_tg(args.threads, args.tokens)
        if rate is not None:
            best[f"llama.cpp {PEER}"] = max(best.get(f"llama.cpp {PEER}", 0.0), rate)
        for name, llm in llms.items():
            best[name] = max(best.get(name, 0.0), decode_rate(llm, prompt, args.tokens))
    with results_file.capture("decode-ab", args):
        print(
            f"decode {args.tokens} tokens, 1 request, {args.threads} threads, best of {args.rounds}"
        )
        print("| system | decode tok/s |")
        print("| --- | ---: |")
        for name, rate in best.items():
            print(f"| {name} | {rate:,.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
