"""The integer-dot kernels on one layer of the embedded model's shapes, in one run: the decode
GEMV and the GEMM at 24, 16 and 8 bits (activations), next to torch's fp32 GEMM on the
same weight dequantized (the float path they replace), at a few row counts (on CPUs with
AMX also the 16- and 8-bit GEMM with its tiles on AMX and on AVX-512 VNNI); then the
lm_head's greedy readout (the argmax kernel) next to computing every logit.

    .venv/bin/python benchmarks/int_dot_gemm.py [--threads N] [--rows 64,512]

Prints ms and GOP/s (2 * rows * N * K per call, best of --reps) and each kernel's ratio to
the fp32 GEMM."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import results as results_file  # noqa: E402
from benchmarks.throughput import best_time  # noqa: E402
from tests.unit.test_native_weights import packed  # noqa: E402
from tokenmill.kernels import ops  # noqa: E402

SHAPES = (("Q4_1", 3072, 576), ("Q4_1", 576, 1536), ("Q8_0", 3072, 576))  # gate/up, down
LM_HEAD = ("Q8_0", 49152, 576)  # the embedded model's (tied embeddings)


def best_ms(fn, reps: int) -> float:
    return best_time(fn, reps) * 1e3


def kernels(x, w, repacked, dense_t):
    """(name, call) of each kernel on rows x."""
    yield "fp32 GEMM (torch.mm)", lambda: x @ dense_t
    for bits in (24, 16, 8):
        yield f"GEMV {bits}-bit", lambda b=bits: ops.int_dot_linear(x, repacked, w, None, bits=b)
    for bits in (24, 16, 8):
        yield f"GEMM {bits}-bit", lambda b=bits: ops.int_dot_gemm(x, repacked, w, None, bits=b)
    if ops.int_dot_amx_available():  # the 8- and 16-bit tiles on AMX, then on AVX-512 VNNI
        for bits in (16, 8):
            for on, tiles in ((True, "AMX"), (False, "VNNI")):
                yield f"GEMM {bits}-bit {tiles} tiles", lambda b=bits, on=on: amx_gemm(
                    on, x, repacked, w, b
                )


def amx_gemm(on: bool, x, repacked, w, bits: int):
    """The GEMM with its tiles on AMX or not, the setting put back to on after the call."""
    ops.set_int_dot_amx(on)
    try:
        return ops.int_dot_gemm(x, repacked, w, None, bits=bits)
    finally:
        ops.set_int_dot_amx(True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--rows", default="64,512")
    ap.add_argument("--reps", type=int, default=7)
    results_file.add_arguments(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if not ops.kernels_available() or ops.int_dot_kind() == 0:
        print("no integer-dot kernels in this build")
        return 1
    with results_file.capture("int-dot-gemm", args):
        print(f"threads {args.threads}; build: int_dot_kind {ops.int_dot_kind()}")
        print("| weight | rows | kernel | ms | GOP/s | vs fp32 GEMM |")
        print("| --- | ---: | --- | ---: | ---: | ---: |")
        for qt, n, k in SHAPES:
            w = packed(qt, n, k)
            repacked, dense_t = ops.int_dot_repack(w), ops.dequant_matrix_t(w)
            for m in (int(r) for r in args.rows.split(",")):
                x = torch.randn(m, k)
                times = {
                    name: best_ms(fn, args.reps) for name, fn in kernels(x, w, repacked, dense_t)
                }
                base = times["fp32 GEMM (torch.mm)"]
                for name, ms in times.items():
                    gops = 2 * m * n * k / ms / 1e6
                    print(
                        f"| {qt} {n}x{k} | {m} | {name} | {ms:.3f} | {gops:.0f} | {base / ms:.2f}x |"
                    )
        greedy_readout(args)
    return 0


def greedy_readout(args: argparse.Namespace) -> None:
    """The lm_head's greedy readout (ops.int_dot_argmax: high-plane estimates, exact where a
    group could win) next to computing every logit with the integer-dot kernels."""
    qt, n, k = LM_HEAD
    w = packed(qt, n, k)
    repacked = ops.int_dot_repack(w)
    bounds = ops.int_dot_bound_table(repacked, w)
    print(f"\nlm_head {qt} {n}x{k}, 24-bit activations: every logit vs the greedy readout (ms)")
    print("| rows | GEMV | GEMM | argmax |")
    print("| ---: | ---: | ---: | ---: |")
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, k)
        gemv = best_ms(lambda x=x: ops.int_dot_linear(x, repacked, w, None), args.reps)
        gemm = best_ms(lambda x=x: ops.int_dot_gemm(x, repacked, w, None), args.reps)
        top = best_ms(lambda x=x: ops.int_dot_argmax(x, repacked, w, bounds), args.reps)
        print(f"| {m} | {gemv:.2f} | {gemm:.2f} | {top:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
