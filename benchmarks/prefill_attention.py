"""The native prefill attention kernel on the embedded model's shapes (30 layers, 9 query heads,
3 KV heads of 64), over a float32 and a float16 KV pool, in one run.

    .venv/bin/python benchmarks/prefill_attention.py [--threads N] [--march MARCH]

Cases: a fresh 512-token prompt (its keys in blocks in order), and prompt chunks after a cached
prefix whose blocks are scattered over the pool (a long-running server's): 8 sequences of
2,048 cached + 32 new tokens, 4 of 4,096 + 16. ms for every layer's call, best of 5 after a
warm-up; --march times the kernels built for another -march (e.g. znver3: the AVX2 build)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import best_time  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, LAYERS, BLOCK = 9, 3, 64, 30, 16
CASES = (("fresh prompt", 512, 512, 1, False), ("after a cached prefix", 2048, 32, 8, True),
         ("after a cached prefix", 4096, 16, 4, True))  # fmt: skip


def kernel(march: str | None, dtype: torch.dtype):
    """The prefill attention call: ops' (this CPU's build) or the -march build's."""
    from tokenmill.kernels import ops

    if march is None:
        return ops.paged_attention_prefill
    from tokenmill.kernels.build import build_kernels

    lib = build_kernels(march)
    if lib is None:
        raise SystemExit(f"the kernels did not build for -march={march} (or no C compiler)")
    fn = lib.tm_paged_attention_prefill_f16 if dtype == torch.float16 else None
    fn = fn or lib.tm_paged_attention_prefill

    def call(q, kv, table, starts, lens, kv_heads, block, scale, window, out):
        fn(
            q.data_ptr(), q.stride(0), kv.data_ptr(), kv.shape[1], table.data_ptr(),
            table.shape[1], starts.data_ptr(), lens.data_ptr(), lens.shape[0], q.shape[1],
            kv_heads, q.shape[2], block, scale, window or 0, out.data_ptr(),
            torch.get_num_threads(),
        )  # fmt: skip

    return call


def case_ms(keys: int, new: int, seqs: int, scattered: bool, dtype, march) -> float:
    g = torch.Generator().manual_seed(0)
    per = -(-keys // BLOCK)
    blocks = seqs * per
    pools = [torch.randn(2, blocks, BLOCK * KV_HEADS * HEAD_DIM, generator=g).to(dtype)
             for _ in range(LAYERS)]  # fmt: skip
    order = torch.randperm(blocks, generator=g) if scattered else torch.arange(blocks)
    table = order.view(seqs, per).contiguous()
    q = torch.randn(seqs * new, HEADS, HEAD_DIM, generator=g)
    out = torch.empty(seqs * new, HEADS * HEAD_DIM)
    starts = torch.arange(0, seqs * new + 1, new, dtype=torch.int64)
    lens = torch.full((seqs,), keys, dtype=torch.int64)
    attend = kernel(march, dtype)

    def step() -> None:
        for pool in pools:
            attend(q, pool, table, starts, lens, KV_HEADS, BLOCK, HEAD_DIM**-0.5, None, out)

    return best_time(step, 5) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--march", default=None, help="time the kernels built for this -march")
    results_file.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with results_file.capture("prefill-attention", args):
        build = f"-march={args.march} build" if args.march else "this CPU's build"
        print(f"Prefill attention ({build}), {LAYERS} layers, {torch.get_num_threads()} threads")
        print()
        print("| case | keys | new tokens x sequences | float32 pool ms | float16 pool ms |")
        print("| --- | ---: | --- | ---: | ---: |")
        for name, keys, new, seqs, scattered in CASES:
            ms = [case_ms(keys, new, seqs, scattered, dt, args.march)
                  for dt in (torch.float32, torch.float16)]  # fmt: skip
            print(f"| {name} | {keys:,} | {new} x {seqs} | {ms[0]:.1f} | {ms[1]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
