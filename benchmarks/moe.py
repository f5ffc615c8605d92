"""Mixture-of-experts speed: a Qwen3-MoE-shaped model next to llama.cpp on the same GGUF, the
dense model of the same active size, and the per-token expert loop, in one run.

    .venv/bin/python benchmarks/moe.py [--quick] [--threads N] [--qtype Q8_0] [--skip-llama-cpp]

Models (random weights from a fixed seed, written as GGUF with the gguf package in llama.cpp's
qwen3moe / qwen3 layouts; sized for a 2-core machine)
    moe     Qwen3-MoE: 8 layers, hidden 512, 8 heads (2 KV heads, head_dim 64), 32 experts of
            width 256, top-4 renormalised; the embedded model's vocabulary (49152)
    dense   Qwen3 with the same attention and an MLP of width 4 x 256 = 1024: the same
            parameters per token as the MoE's active ones

Numbers (tokens per second)
    decode      one request, 16 prompt tokens, 64 output tokens (EOS ignored): 63 / (time from
                the first token to the end), median of 3. llama.cpp: llama-bench tg64.
    32 users    32 requests at once, 64 prompt + 64 output tokens each: output tokens / wall
                time. llama.cpp: llama-batched-bench -npp 64 -ntg 64 -npl 32, S_TG.
    grouped vs per-token   one MoE layer on T rows of random activations: the engine's path
                (tokens sorted by expert, one matmul per expert) against a loop over tokens
                and their experts (SparseMoE.per_token), same weights; median of 5.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import llama_cpp_dirs  # noqa: E402

SHAPE = dict(
    hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
    head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.05,
)  # fmt: skip
EXPERTS, TOP_K, WIDTH = 32, 4, 256


def make_models(quick: bool, workdir: Path, qtype: str) -> dict[str, Path]:
    """The MoE and the dense GGUF files."""
    import torch
    import transformers

    from tests.family_gguf import write_family_gguf
    from tests.tiny_models import embedded_tokenizer

    shape = {**SHAPE, "vocab_size": embedded_tokenizer().vocab_size}
    experts = EXPERTS // 2 if quick else EXPERTS
    if quick:
        shape["num_hidden_layers"] = 4
    torch.manual_seed(0)
    moe = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        **shape, num_experts=experts, num_experts_per_tok=TOP_K, moe_intermediate_size=WIDTH,
        intermediate_size=TOP_K * WIDTH, norm_topk_prob=True,
    ))  # fmt: skip
    dense = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**shape, intermediate_size=TOP_K * WIDTH)
    )
    paths = {"moe": workdir / f"moe-{qtype}.gguf", "dense": workdir / f"dense-{qtype}.gguf"}
    write_family_gguf(moe.float(), "qwen3_moe", paths["moe"], qtype)
    write_family_gguf(dense.float(), "qwen3", paths["dense"], qtype)
    return paths


def tokenmill_speed(path: Path, threads: int) -> tuple[float, float, object]:
    """(decode tokens/s, 32-user output tokens/s, the LLM)."""
    from tokenmill import LLM, SamplingParams

    llm = LLM(str(path), kv_cache_memory_gib=1.0, num_threads=threads, max_num_seqs=32)
    rng = __import__("random").Random(0)

    def prompts(n: int, length: int) -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(length)]}
                for _ in range(n)]  # fmt: skip

    def run(n: int, length: int, out: int) -> float:
        params = SamplingParams(temperature=0, max_tokens=out, min_tokens=out, ignore_eos=True)
        t0 = time.perf_counter()
        llm.generate(prompts(n, length), params)
        return time.perf_counter() - t0

    def decode_rate() -> float:
        """63 tokens after the first / the time from the first token to the end."""
        params = SamplingParams(temperature=0, max_tokens=64, min_tokens=64, ignore_eos=True)
        out = llm.generate(prompts(1, 16), params)[0]
        return 63 / (time.monotonic() - out.metrics["first_token_time"])

    run(1, 16, 4)  # warm-up
    decode = statistics.median(decode_rate() for _ in range(3))
    batch = statistics.median(32 * 64 / run(32, 64, 64) for _ in range(2))
    return decode, batch, llm


def grouped_vs_loop(llm, rows: int) -> tuple[float, float]:
    """Seconds of one MoE layer on `rows` rows: the grouped path, the per-token loop."""
    import torch

    from tokenmill.model.models.moe import SparseMoE

    moe = next(layer.mlp for layer in llm.engine.core.model.layers
               if isinstance(layer.mlp, SparseMoE))  # fmt: skip
    x = torch.randn(rows, llm.engine.core.model.config.hidden_size)

    def timed(fn) -> float:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            with torch.inference_mode():
                fn(x)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    with torch.inference_mode():
        assert torch.allclose(moe(x), moe.per_token(x), atol=1e-4, rtol=1e-4)
    return timed(moe), timed(moe.per_token)


def llama_cpp_speed(path: Path, threads: int) -> tuple[float | None, float | None, str]:
    """(decode tokens/s, 32-user output tokens/s, note)."""
    bin_dir, _ = llama_cpp_dirs()
    bench, batched = bin_dir / "llama-bench", bin_dir / "llama-batched-bench"
    if not bench.is_file() or not batched.is_file():
        return None, None, f"llama.cpp binaries not in {bin_dir}"
    t = str(threads)
    proc = subprocess.run(
        [str(bench), "-m", str(path), "-t", t, "-p", "0", "-n", "64", "-r", "3", "-o", "json"],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        return None, None, "llama-bench: " + proc.stderr.strip().splitlines()[-1][:200]
    decode = float(json.loads(proc.stdout)[0]["avg_ts"])
    proc = subprocess.run(
        [str(batched), "-m", str(path), "-t", t, "-c", "8192", "-npp", "64", "-ntg", "64",
         "-npl", "32", "--output-format", "jsonl"],
        capture_output=True, text=True,
    )  # fmt: skip
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    batch = next((float(r["speed_tg"]) for r in rows if "speed_tg" in r), None)
    return decode, batch, ""


def fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--quick", action="store_true", help="4 layers, 16 experts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--qtype", default="Q8_0", help="GGUF format of the weights (Q8_0, Q4_0)")
    ap.add_argument("--skip-llama-cpp", action="store_true")
    results_file.add_arguments(ap)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_models(args.quick, Path(tmp), args.qtype)
        rows = []
        for name, path in paths.items():
            decode, batch, llm = tokenmill_speed(path, args.threads)
            rows.append((f"tokenmill {name} {args.qtype}", decode, batch))
            if name == "moe":
                loops = [(t, *grouped_vs_loop(llm, t)) for t in (1, 8, 32, 128)]
            del llm
            if not args.skip_llama_cpp:
                d, b, note = llama_cpp_speed(path, args.threads)
                rows.append(
                    (f"llama.cpp {name} {args.qtype}" + (f" ({note})" if note else ""), d, b)
                )
    lines = ["| system | decode tok/s | 32 users output tok/s |", "|---|---:|---:|"]
    lines += [f"| {n} | {fmt(d)} | {fmt(b)} |" for n, d, b in rows]
    lines += [
        "",
        "| MoE layer rows | grouped ms | per-token loop ms | speed-up |",
        "|---:|---:|---:|---:|",
    ]
    lines += [f"| {t} | {g * 1e3:.2f} | {p * 1e3:.2f} | {p / g:.1f}x |" for t, g, p in loops]
    table = "\n".join(lines)
    print(table)
    results_file.write("moe", table, args, title="Mixture of experts: Qwen3-MoE shape")


if __name__ == "__main__":
    main()
