"""The KV cache's dtype (--kv-cache-dtype): what a float16 pool saves and what it moves.

    .venv/bin/python benchmarks/kv_cache_dtype.py [--sequences 64] [--tokens 1024] [--threads N]
        [--attention-only] [--march MARCH]

On the embedded model (SmolLM2-135M-Instruct: 30 layers, 3 KV heads of 64), in one run:

Decode attention    one decode step of --sequences sequences (every layer's native paged
                    attention kernel, blocks scattered over the pool) at 128, 192 and 256 keys
                    a sequence, over a float32 and a float16 pool: ms a step and the pool's
                    bytes read per second, beside the machine's read bandwidth (torch.sum over
                    1 GiB of float32).
Fidelity            next-token distributions over the first --tokens tokens of README.md,
                    float16 pool against float32 pool (both the default native weights):
                    KLD mean and max, max |log-prob difference|, same top-1; prefilled whole,
                    and a token at a time (decode rows) over the first 256.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import best_time  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM, LAYERS, BLOCK = 9, 3, 64, 30, 16


def read_bandwidth() -> float:
    """GB/s of torch.sum over 1 GiB of float32, best of 5."""
    x = torch.ones(1 << 28)
    return x.numel() * 4 / best_time(x.sum, 5) / 1e9


def decode_step_ms(sequences: int, keys: int, dtype: torch.dtype, march: str | None) -> float:
    """One decode step's attention over every layer (a pool and block tables per layer), best
    of 5 after warm-up; march: the kernels built for that -march instead of this CPU's."""
    from tokenmill.kernels import ops

    blocks = -(-keys // BLOCK)
    pool_blocks = sequences * blocks
    g = torch.Generator().manual_seed(0)
    pools = [torch.randn(2, pool_blocks, BLOCK * KV_HEADS * HEAD_DIM, generator=g).to(dtype)
             for _ in range(LAYERS)]  # fmt: skip
    tables = [torch.randperm(pool_blocks, generator=g).view(sequences, blocks) for _ in pools]
    q = torch.randn(sequences, HEADS, HEAD_DIM, generator=g)
    lens = torch.full((sequences,), keys, dtype=torch.int64)

    attend = ops.paged_attention_decode
    if march is not None:
        attend = build_attention(march)

    def step() -> None:
        for pool, table in zip(pools, tables, strict=True):
            attend(q, pool, table, lens, KV_HEADS, BLOCK, HEAD_DIM**-0.5, None)

    return best_time(step, 5) * 1e3


def build_attention(march: str):
    """ops.paged_attention_decode's call on the kernels built for -march=`march`."""
    from tokenmill.kernels.build import build_kernels

    lib = build_kernels(march)
    if lib is None:
        raise SystemExit(f"the kernels did not build for -march={march} (or no C compiler)")

    def attend(q, pool, table, lens, kv_heads, block, scale, window):
        out = torch.empty_like(q)
        fn = lib.tm_paged_attention_decode_f16 if pool.dtype == torch.float16 else None
        (fn or lib.tm_paged_attention_decode)(
            q.data_ptr(), pool.data_ptr(), pool.shape[1], table.data_ptr(), lens.data_ptr(),
            q.shape[0], q.shape[1], kv_heads, q.shape[2], block, table.shape[1], scale,
            window or 0, out.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        return out

    return attend


def attention_table(sequences: int, march: str | None) -> str:
    bandwidth = read_bandwidth()
    build = f"-march={march} build" if march else "this CPU's build"
    lines = [
        f"Decode attention ({build}), {sequences} sequences x {LAYERS} layers ({HEADS} query "
        f"heads, {KV_HEADS} KV heads of {HEAD_DIM}); read bandwidth {bandwidth:.1f} GB/s "
        "(torch.sum over 1 GiB float32)",
        "",
        "| keys a sequence | float32 pool ms | GB/s | float16 pool ms | GB/s | float16 speed-up |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for keys in (128, 192, 256):
        row = [str(keys)]
        times = []
        for dtype in (torch.float32, torch.float16):
            ms = decode_step_ms(sequences, keys, dtype, march)
            pool_bytes = 2 * sequences * keys * KV_HEADS * HEAD_DIM * dtype.itemsize * LAYERS
            times.append(ms)
            row += [f"{ms:.1f}", f"{pool_bytes / ms / 1e6:.1f}"]
        row.append(f"{times[0] / times[1]:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def fidelity_table(tokens: int) -> str:
    from tokenmill import LLM
    from tokenmill.engine.scoring import sequence_logits

    half, full = LLM(kv_cache_dtype="float16"), LLM()
    ids = half.get_tokenizer().encode((ROOT / "README.md").read_text())[:tokens]
    lines = [
        "Fidelity, float16 pool against float32 pool (native weights), README.md's first "
        f"{len(ids)} tokens",
        "",
        "| prefill | positions | KLD mean | KLD max | max abs log-prob difference | same top-1 |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, chunk, n in (("whole prompt", None, len(ids)), ("a token at a time", 1, 256)):
        a = sequence_logits(half.engine.core, ids[:n], chunk_size=chunk).log_softmax(-1)
        b = sequence_logits(full.engine.core, ids[:n], chunk_size=chunk).log_softmax(-1)
        kld = (b.exp() * (b - a)).sum(-1)
        same = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
        lines.append(
            f"| {name} | {n:,} | {kld.mean():.1e} | {kld.max():.1e} | "
            f"{(a - b).abs().max():.3f} | {same:.2%} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--attention-only", action="store_true", help="skip the fidelity table")
    ap.add_argument(
        "--march",
        default=None,
        help="time the attention kernels built for this -march (e.g. znver3: the AVX2 build)",
    )
    results_file.add_arguments(ap)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with results_file.capture("kv-cache-dtype", args):
        print(attention_table(args.sequences, args.march))
        if not args.attention_only:
            print()
            print(fidelity_table(args.tokens))


if __name__ == "__main__":
    main()
