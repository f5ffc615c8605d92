"""Structured-output costs on the embedded model:

- grammar compile time p50/p99 over the JSON Schema sample (cold: a fresh cache per schema);
- token-mask computation time per token p50/p99 (walking valid instances through matchers);
- decode throughput with a json_schema constraint vs unconstrained, 32 concurrent requests
  (same prompts, same token budget), and the overhead between them.

    python benchmarks/structured_output.py [--requests 32] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill import LLM, SamplingParams  # noqa: E402
from tokenmill.structured.grammar import GrammarCompiler, GrammarError  # noqa: E402
from tokenmill.structured.spec import StructuredOutputsParams  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "jsonschemabench-sample"
# Long enough that no request completes inside the token budget: every step runs all rows
# constrained, so tokens/s compares like with like (no early finishers shrinking the batch).
LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "story": {"type": "string", "minLength": 4000},
        "title": {"type": "string"},
    },
    "required": ["story", "title"],
}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def compile_and_mask_times(llm: LLM) -> dict[str, float]:
    tok = llm.get_tokenizer()
    compile_s, mask_s, failures, schemas = [], [], 0, 0
    words = (tok.vocab_size + 31) // 32
    buf = torch.empty(words, dtype=torch.int32)
    for path in sorted(SAMPLE.iterdir()):
        if path.name == "README.md":
            continue
        doc = json.loads(path.read_text())
        schema = doc["schema"] if isinstance(doc["schema"], dict) else {}
        compiler = GrammarCompiler(tok, tok.vocab_size)  # cold cache
        spec = StructuredOutputsParams(json=schema)
        schemas += 1
        t0 = time.perf_counter()
        try:
            compiler.matcher(spec)
        except GrammarError:
            failures += 1
            continue
        compile_s.append(time.perf_counter() - t0)
        for test in doc["tests"]:
            if not test["valid"]:
                continue
            matcher = compiler.matcher(spec)
            for token in tok.encode(
                json.dumps(test["data"], ensure_ascii=False), add_special_tokens=False
            ):
                t0 = time.perf_counter()
                matcher.unsafe_compute_mask_ptr(buf.data_ptr(), words * 4)
                mask_s.append(time.perf_counter() - t0)
                if not matcher.consume_token(token):
                    break
    return {
        "schemas": schemas,
        "compile_failures": failures,
        "compile_p50_ms": 1e3 * statistics.median(compile_s),
        "compile_p99_ms": 1e3 * pct(compile_s, 0.99),
        "mask_tokens": len(mask_s),
        "mask_p50_us": 1e6 * statistics.median(mask_s),
        "mask_p99_us": 1e6 * pct(mask_s, 0.99),
    }


def throughput(llm: LLM, n: int, max_tokens: int, constrained: bool) -> float:
    tok = llm.get_tokenizer()
    prompts = []
    for i in range(n):
        text = llm.engine.processor.render_chat(
            [{"role": "user", "content": f"Write story number {i} as JSON."}]
        )
        prompts.append({"prompt_token_ids": tok.encode(text, add_special_tokens=False)})
    spec = StructuredOutputsParams(json=LONG_SCHEMA) if constrained else None
    params = SamplingParams(temperature=0.8, seed=0, max_tokens=max_tokens, ignore_eos=True,
                            structured_outputs=spec, repetition_detection=False)  # fmt: skip
    llm.generate(prompts[:2], params)  # warm-up (and grammar cache)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    results_file.add_arguments(ap)
    args = ap.parse_args()
    llm = LLM(max_num_seqs=64)
    stats = compile_and_mask_times(llm)
    free = throughput(llm, args.requests, args.max_tokens, constrained=False)
    constrained = throughput(llm, args.requests, args.max_tokens, constrained=True)
    with results_file.capture("structured-output", args):
        report(args, stats, free, constrained)


def report(args: argparse.Namespace, stats: dict, free: float, constrained: float) -> None:
    print(
        f"grammar compile over {stats['schemas']} schemas: p50 {stats['compile_p50_ms']:.2f} ms, "
        f"p99 {stats['compile_p99_ms']:.2f} ms; {stats['compile_failures']} schemas rejected by the compiler"
    )
    print(
        f"token mask over {stats['mask_tokens']} tokens: p50 {stats['mask_p50_us']:.1f} us, "
        f"p99 {stats['mask_p99_us']:.1f} us"
    )
    print(f"{args.requests} concurrent requests: unconstrained {free:.0f} tok/s, json_schema {constrained:.0f} tok/s "
          f"-> overhead {100 * (1 - constrained / free):.1f}%")  # fmt: skip


if __name__ == "__main__":
    main()
