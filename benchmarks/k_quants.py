"""K-quant files (Q4_K_M): tokenmill's native weights with the integer-dot kernels on the
Q4_K and Q6_K layers, the same without them (the fp32 GEMV and GEMM on the dequantized blocks), and
llama.cpp on the same file, in one run.

    .venv/bin/python benchmarks/k_quants.py [--layers 8] [--threads N] [--skip-llama-cpp]

Model: Qwen3-0.6B's layer shape (hidden 1024, 16 heads, 8 KV heads of 128, MLP 3072) with
--layers layers and the embedded model's vocabulary (49152), random weights from a fixed seed,
written as F16 GGUF and quantized to Q4_K_M by llama.cpp's llama-quantize (Q4_K for most
weights, Q6_K for some; every row a multiple of 256, so no fallback formats).

Numbers (tokens per second)
    prefill 512   one 512-token prompt: 512 / time of a request with max_tokens=1, best of 3.
                  llama.cpp: llama-bench pp512.
    decode        one request, 16 prompt tokens, 64 output tokens (EOS ignored): 63 / (time
                  from the first token to the end), best of 3. llama.cpp: llama-bench tg64.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import llama_cpp_dirs  # noqa: E402

SHAPE = dict(
    hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    intermediate_size=3072, max_position_embeddings=4096, rms_norm_eps=1e-6,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    initializer_range=0.05,
)  # fmt: skip


def make_model(layers: int, workdir: Path) -> Path:
    """The Q4_K_M file (llama-quantize from an F16 one)."""
    import torch
    import transformers

    from tests.family_gguf import write_family_gguf
    from tests.tiny_models import embedded_tokenizer

    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        **SHAPE, num_hidden_layers=layers, vocab_size=embedded_tokenizer().vocab_size
    )
    f16, q4_k_m = workdir / "qwen3-F16.gguf", workdir / "qwen3-Q4_K_M.gguf"
    write_family_gguf(transformers.Qwen3ForCausalLM(config).float(), "qwen3", f16, "F16")
    quantize = llama_cpp_dirs()[0] / "llama-quantize"
    subprocess.run([str(quantize), str(f16), str(q4_k_m), "Q4_K_M"], check=True,
                   capture_output=True)  # fmt: skip
    return q4_k_m


def formats(path: Path) -> str:
    import gguf

    reader = gguf.GGUFReader(str(path))
    counts = collections.Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
    return ", ".join(f"{n} {name}" for name, n in counts.most_common())


def tokenmill_speed(path: Path, threads: int, int_dot: bool) -> tuple[float, float]:
    """(prefill 512 tokens/s, decode tokens/s)."""
    from tokenmill import LLM, SamplingParams

    llm = LLM(str(path), kv_cache_memory_gib=0.5, num_threads=threads, int_dot=int_dot)
    rng = __import__("random").Random(0)

    def prompt(n: int) -> list[dict]:
        return [{"prompt_token_ids": [rng.randrange(100, 40000) for _ in range(n)]}]

    def greedy(n: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=n, min_tokens=n, ignore_eos=True)

    llm.generate(prompt(64), greedy(4))  # warm-up
    prefill = []
    for _ in range(3):
        t0 = time.perf_counter()
        llm.generate(prompt(512), greedy(1))
        prefill.append(512 / (time.perf_counter() - t0))
    decode = []
    for _ in range(3):
        out = llm.generate(prompt(16), greedy(64))[0]
        decode.append(63 / (time.monotonic() - out.metrics["first_token_time"]))
    return max(prefill), max(decode)


def llama_cpp_speed(path: Path, threads: int) -> tuple[float | None, float | None]:
    bench = llama_cpp_dirs()[0] / "llama-bench"
    if not bench.is_file():
        return None, None
    cmd = [str(bench), "-m", str(path), "-t", str(threads), "-p", "512", "-n", "64", "-r", "3",
           "-o", "json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, None
    rows = json.loads(proc.stdout)
    prefill = next(max(r["samples_ts"]) for r in rows if r["n_prompt"])
    decode = next(max(r["samples_ts"]) for r in rows if r["n_gen"])
    return prefill, decode


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-llama-cpp", action="store_true")
    results_file.add_arguments(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = make_model(args.layers, Path(tmp))
        rows = {
            "tokenmill native (integer-dot on Q4_K, Q6_K)": tokenmill_speed(
                path, args.threads, True
            ),
            "tokenmill native, --no-int-dot (fp32 GEMV/GEMM)": tokenmill_speed(
                path, args.threads, False
            ),
        }
        if not args.skip_llama_cpp:
            rows["llama.cpp"] = llama_cpp_speed(path, args.threads)
        weights = formats(path)
    with results_file.capture("k-quants", args):
        print(f"Qwen3-0.6B layer shape x {args.layers} layers, Q4_K_M ({weights}), "
              f"{args.threads} threads")  # fmt: skip
        print("| system | prefill 512 tok/s | decode tok/s |")
        print("| --- | ---: | ---: |")
        for name, (prefill, decode) in rows.items():
            cells = ["—" if v is None else f"{v:,.0f}" for v in (prefill, decode)]
            print(f"| {name} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
