"""Prefill of one 512-token prompt: tokenmill's native weights at each integer-dot GEMM
precision and the int8 path, next to llama-bench pp512 (F16, Q4_1), in alternating rounds of
one run; each system's best rate (a busy moment only slows a run down).

    .venv/bin/python benchmarks/prefill_ab.py [--rounds 3] [--threads N]

Needs the llama.cpp build and GGUF variants of benchmarks/peers (build_llama_cpp.sh,
make_gguf_variants.sh); without them only tokenmill's rows are printed."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import MODEL_STEM, llama_cpp_dirs  # noqa: E402

VARIANTS = {
    "tokenmill native (16-bit activations, default)": {"weights": "native"},
    "tokenmill native a24 (24-bit activations)": {
        "weights": "native",
        "int_dot_activation_bits": 24,
    },
    "tokenmill native a8 (8-bit activations)": {"weights": "native", "int_dot_activation_bits": 8},
    "tokenmill int8 (W8A8)": {"weights": "int8"},
}
PEERS = ("F16", "Q4_1")


def llama_bench(variant: str, threads: int, prompt: int) -> float | None:
    bin_dir, models = llama_cpp_dirs()
    model = models / f"{MODEL_STEM}.{variant}.gguf"
    if not (bin_dir / "llama-bench").is_file() or not model.is_file():
        return None
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(prompt)]
    out = subprocess.run([*cmd, "-n", "0", "-r", "3", "-o", "json"], capture_output=True, text=True)
    return max(json.loads(out.stdout)[0]["samples_ts"]) if out.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--prompt", type=int, default=512)
    results_file.add_arguments(ap)
    args = ap.parse_args(argv)
    from tokenmill import LLM, SamplingParams

    llms = {
        name: LLM(None, kv_cache_memory_gib=0.5, num_threads=args.threads, **kw)
        for name, kw in VARIANTS.items()
    }
    params = SamplingParams(temperature=0, max_tokens=1)
    rng = random.Random(0)
    best: dict[str, float] = {}
    for llm in llms.values():  # warm-up
        llm.generate([{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(64)]}], params)
    for _ in range(args.rounds):
        for variant in PEERS:
            rate = llama_bench(variant, args.threads, args.prompt)
            if rate is not None:
                key = f"llama.cpp {variant}"
                best[key] = max(best.get(key, 0.0), rate)
        for name, llm in llms.items():
            for _ in range(3):
                prompt = [rng.randrange(100, 40000) for _ in range(args.prompt)]
                t = time.perf_counter()
                llm.generate([{"prompt_token_ids": prompt}], params)
                rate = args.prompt / (time.perf_counter() - t)
                best[name] = max(best.get(name, 0.0), rate)
    peer = max((v for k, v in best.items() if k.startswith("llama.cpp")), default=None)
    with results_file.capture("prefill-ab", args):
        print(f"prefill {args.prompt} tokens, {args.threads} threads, best of {args.rounds} rounds")
        print("| system | tok/s | / best llama.cpp |")
        print("| --- | ---: | ---: |")
        for name, rate in best.items():
            ratio = f"{rate / peer:.2f}x" if peer else "-"
            print(f"| {name} | {rate:,.0f} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
