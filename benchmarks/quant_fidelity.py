"""Fidelity of native weights, int8 (W8A8) and bfloat16 against float32 on the same model,
reported the way llama.cpp's `llama-perplexity --kl-divergence` does: mean KL divergence,
how often the top token agrees ("same top"), RMS of the probability difference of the
reference top token, and perplexity of both.

    python benchmarks/quant_fidelity.py [--model PATH] [--tokens 2048] [--ctx 512]
        [--variants native,int8,bfloat16]
"""

from __future__ import annotations

import argparse
import math
import pydoc

import torch

from tokenmill.engine.arg_utils import build_engine_config
from tokenmill.engine.core import EngineCore
from tokenmill.engine.scoring import sequence_logits


def evaluation_text() -> str:
    """English prose that ships with Python (no downloads): stdlib module documentation."""
    import collections
    import json
    import logging
    import subprocess
    import threading

    parts = [pydoc.getdoc(m) for m in (subprocess, logging, json, threading, collections)]
    parts += [
        pydoc.getdoc(f) for f in (subprocess.run, logging.basicConfig, json.dumps, threading.Thread)
    ]
    return "\n\n".join(parts)


def kl_stats(
    ref_logits: torch.Tensor, test_logits: torch.Tensor, targets: torch.Tensor
) -> dict[str, float]:
    ref_lp = ref_logits.log_softmax(-1)
    test_lp = test_logits.log_softmax(-1)
    kl = (ref_lp.exp() * (ref_lp - test_lp)).sum(-1)
    ref_top = ref_lp.argmax(-1)
    same_top = (ref_top == test_lp.argmax(-1)).float().mean().item()
    dp = ref_lp.exp().gather(1, ref_top[:, None]) - test_lp.exp().gather(1, ref_top[:, None])
    nll_ref = -ref_lp.gather(1, targets[:, None]).mean().item()
    nll_test = -test_lp.gather(1, targets[:, None]).mean().item()
    return {
        "mean_kld": kl.mean().item(),
        "p99_kld": kl.quantile(0.99).item(),
        "same_top_pct": 100 * same_top,
        "rms_dp_pct": 100 * dp.pow(2).mean().sqrt().item(),
        "ppl_ref": math.exp(nll_ref),
        "ppl_test": math.exp(nll_test),
    }


VARIANTS = {
    "native": ("native (the file's packed blocks, exact in-kernel dequant)", {"weights": "native"}),
    "int8": ("int8 (W8A8, per-channel weights, per-row activations)", {"weights": "int8"}),
    "bfloat16": ("bfloat16 (bf16 weights and GEMM inputs, fp32 rest)", {"weights": "bfloat16"}),
}


def measure(
    model: str | None, num_tokens: int, ctx: int, variant: str = "int8"
) -> dict[str, float]:
    ref = EngineCore(build_engine_config(model, kv_cache_memory_gib=0.25))
    test = EngineCore(build_engine_config(model, kv_cache_memory_gib=0.25, **VARIANTS[variant][1]))
    ids = ref.tokenizer.encode(evaluation_text())[:num_tokens]
    ref_all, test_all, targets = [], [], []
    for start in range(0, len(ids) - 1, ctx):
        window = ids[start : start + ctx + 1]
        if len(window) < 2:
            break
        ref_all.append(sequence_logits(ref, window[:-1]))
        test_all.append(sequence_logits(test, window[:-1]))
        targets.append(torch.tensor(window[1:]))
    return kl_stats(torch.cat(ref_all), torch.cat(test_all), torch.cat(targets))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--variants", default="native,int8,bfloat16")
    args = ap.parse_args()
    for variant in args.variants.split(","):
        stats = measure(args.model, args.tokens, args.ctx, variant)
        print(f"{VARIANTS[variant][0]} vs float32 over {args.tokens} tokens:")
        for key, value in stats.items():
            print(f"  {key:14s} {value:.5f}")


if __name__ == "__main__":
    main()
