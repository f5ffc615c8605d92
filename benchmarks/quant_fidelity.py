"""KL divergence of every weight scheme from float32 on the embedded model, next to
llama.cpp's own `llama-perplexity --kl-divergence` of its conversions of the same weights,
in one run on the same text, context and chunks.

    python benchmarks/quant_fidelity.py [--chunks 5] [--ctx 512] [--markdown PATH]
        [--skip-llama-cpp] [--threads N]

Reference on both sides: the embedded Q4_1 file dequantized to float32 (tokenmill's
`--weights float32`; llama.cpp's F32 copy made by benchmarks/peers/make_gguf_variants.sh).
Text: tokenmill/quant/data/evaluation.txt; chunks of --ctx tokens, the second half of each
scored (llama-perplexity's protocol, which tokenmill.quant.kld follows). tokenmill's
at-load formats quantize the dequantized weights with gguf-py's reference quantizers, as
llama-quantize --allow-requantize does, and keep the output layer in q8_0 as it does.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from tokenmill.cache_dirs import cache_root  # noqa: E402
from tokenmill.quant.fidelity import FidelityBench  # noqa: E402
from tokenmill.quant.plan import QuantPlan  # noqa: E402
from tokenmill.quant.texts import EVALUATION_TEXT  # noqa: E402

PEER_DIR = cache_root() / "llama.cpp-0.3.36"
MODEL = "SmolLM2-135M-Instruct"

# (label, plan, the llama.cpp conversion it pairs with)
ROWS = [
    ("native (the file: Q4_1, output Q8_0)", QuantPlan("native"), "Q4_1"),
    ("q8_0", QuantPlan("q8_0"), "Q8_0"),
    ("q5_1", QuantPlan("q5_1"), "Q5_1"),
    ("q5_0", QuantPlan("q5_0"), "Q5_0"),
    ("q4_1", QuantPlan("q4_1"), "Q4_1"),
    ("q4_0", QuantPlan("q4_0"), "Q4_0"),
    ("q4_0 + calibration (AWQ)", QuantPlan("q4_0", calibration="builtin"), None),
    ("q4_0, output q4_0 too", QuantPlan("q4_0", (("lm_head", "q4_0"),)), None),
    ("int8 (W8A8)", QuantPlan("int8"), None),
    ("int8 + calibration (SmoothQuant)", QuantPlan("int8", calibration="builtin"), None),
    ("bfloat16", QuantPlan("bfloat16"), "F16"),
]
EXTRA_PEERS = ["Q4_K_M"]

_PATTERNS = {
    "ppl_test": r"Mean PPL\(Q\)\s*:\s*([\d.]+)",
    "ppl_ref": r"Mean PPL\(base\)\s*:\s*([\d.]+)",
    "mean_kld": r"Mean\s+KLD:\s*([-\d.]+)",
    "p99_kld": r"99\.0%\s+KLD:\s*([-\d.]+)",
    "max_kld": r"Maximum KLD:\s*([-\d.]+)",
    "rms_dp_pct": r"RMS Δp\s*:\s*([\d.]+)",
    "same_top_pct": r"Same top p:\s*([\d.]+)",
}


def llama_cpp_kld(
    variants: list[str], ctx: int, chunks: int, threads: int
) -> dict[str, dict[str, float]]:
    binary = PEER_DIR / "bin" / "llama-perplexity"
    models = PEER_DIR / "models"
    base_model = models / f"{MODEL}.F32.gguf"
    if not binary.exists() or not base_model.exists():
        print(f"(llama.cpp skipped: {binary} or {base_model} missing; see benchmarks/peers)")
        return {}
    common = ["-f", str(EVALUATION_TEXT), "-c", str(ctx), "--chunks", str(chunks)]
    common += ["-t", str(threads), "-b", str(ctx)]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base.kld")
        subprocess.run(
            [str(binary), "-m", str(base_model), *common, "--kl-divergence-base", base],
            check=True,
            capture_output=True,
        )
        for variant in variants:
            path = models / f"{MODEL}.{variant}.gguf"
            if not path.exists():
                continue
            proc = subprocess.run(
                [str(binary), "-m", str(path), *common, "--kl-divergence-base", base,
                 "--kl-divergence"],
                capture_output=True,
                text=True,
            )  # fmt: skip
            text = proc.stdout + proc.stderr
            figures = {}
            for key, pattern in _PATTERNS.items():
                match = re.search(pattern, text)
                if match:
                    figures[key] = float(match.group(1))
            results[variant] = figures
    return results


def _cells(fig: dict | None) -> list[str]:
    if not fig or "mean_kld" not in fig:
        return ["", "", "", ""]
    return [
        f"{fig['mean_kld']:.5f}",
        f"{fig.get('p99_kld', float('nan')):.4f}",
        f"{fig.get('same_top_pct', float('nan')):.2f}",
        f"{fig.get('ppl_test', float('nan')):.3f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--skip-llama-cpp", action="store_true")
    results_file.add_arguments(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    bench = FidelityBench(None, None, args.ctx, args.chunks)
    ours = {}
    for label, plan, _ in ROWS:
        try:
            ours[label] = bench.measure(plan).to_dict()
        except ValueError as e:  # a format this build cannot run
            print(f"({label}: {e})")
        print(f"tokenmill {label}: {_cells(ours.get(label))}", flush=True)
    q4km = PEER_DIR / "models" / f"{MODEL}.Q4_K_M.gguf"
    if q4km.exists():  # the same file both ways: tokenmill native vs llama.cpp
        try:
            report = bench.measure_file(str(q4km), QuantPlan("native"))
            ours["native on the Q4_K_M file"] = report.to_dict()
        except ValueError as e:
            print(f"(native on the Q4_K_M file: {e})")
    peers = {}
    if not args.skip_llama_cpp:
        wanted = sorted({p for _, _, p in ROWS if p} | set(EXTRA_PEERS))
        peers = llama_cpp_kld(wanted, args.ctx, args.chunks, args.threads)

    lines = [
        f"KL divergence from float32, {bench.chunks.num_scored} tokens "
        f"({len(bench.chunks.chunks)} chunks of {args.ctx}, second halves scored), "
        f"float32 perplexity {next(iter(ours.values()))['ppl_ref']:.3f}",
        "",
        "| tokenmill scheme | mean KLD | p99 KLD | same top % | PPL "
        "| llama.cpp file | mean KLD | p99 KLD | same top % | PPL |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for label, _, peer in ROWS:
        lines.append(
            "| " + " | ".join([label, *_cells(ours.get(label)), peer or "",
                               *_cells(peers.get(peer))]) + " |"
        )  # fmt: skip
    if "native on the Q4_K_M file" in ours or "Q4_K_M" in peers:
        lines.append(
            "| " + " | ".join(["native on the Q4_K_M file",
                               *_cells(ours.get("native on the Q4_K_M file")), "Q4_K_M",
                               *_cells(peers.get("Q4_K_M"))]) + " |"
        )  # fmt: skip
    text = "\n".join(lines)
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    results_file.write("quant-fidelity", text, args)


if __name__ == "__main__":
    main()
