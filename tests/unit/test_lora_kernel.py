"""The multi-LoRA C kernel (lora_kernels.c) against a float64 reference on the same fp16
weights, in every build (AVX-512 where the CPU has it, AVX2, portable): segments of
different sizes and ranks, a module an adapter leaves out, scattered rows, rows outside
every segment, widths and column counts off the vector and tile sizes."""

from __future__ import annotations

import ctypes

import pytest
import torch

from tests.kernel_builds import KERNEL_BUILDS, kernel_build
from tokenmill.kernels import ops

pytestmark = pytest.mark.skipif(
    not ops.kernels_available(), reason="no C compiler for the native kernels"
)


@pytest.fixture(scope="module", params=KERNEL_BUILDS)
def lib(request):
    return kernel_build(request.param)


def _case(k: int, outs: list[int], ranks: list[list[int]], groups: list[list[int]], m: int):
    """x, y, each segment's (A, [B per module]) fp16, and the float64 reference of y."""
    gen = torch.Generator().manual_seed(k * 7 + len(outs))
    x = torch.randn(m, k, generator=gen)
    y = torch.randn(m, sum(outs), generator=gen)
    ref = y.double().clone()
    weights = []
    for rows, widths in zip(groups, ranks, strict=True):
        a = torch.randn(sum(widths), k, generator=gen).half()
        bs = [
            (torch.randn(w, n, generator=gen) * 0.1).half()
            for w, n in zip(widths, outs, strict=True)
        ]
        weights.append((a, bs))
        t = x[rows].double() @ a.double().T
        col = out0 = 0
        for w, n, b in zip(widths, outs, bs, strict=True):
            ref[rows, out0 : out0 + n] += t[:, col : col + w] @ b.double()
            col, out0 = col + w, out0 + n
    return x, y, weights, ref


def _run(lib, x, y, weights, ranks, groups, outs) -> None:
    a = [w[0] for w in weights]
    b = [torch.cat([ops.lora_b_tiles(block) for block in w[1]]) for w in weights]
    a_ptrs = (ctypes.c_void_p * len(a))(*[t.data_ptr() for t in a])
    b_ptrs = (ctypes.c_void_p * len(b))(*[t.data_ptr() for t in b])
    starts = [0]
    for rows in groups:
        starts.append(starts[-1] + len(rows))
    seg = torch.tensor(starts, dtype=torch.int32)
    rows = torch.tensor([r for g in groups for r in g], dtype=torch.int32)
    widths = torch.tensor([w for ws in ranks for w in ws], dtype=torch.int32)
    outs_t = torch.tensor(outs, dtype=torch.int32)
    lib.tm_lora_sgmv(
        x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), x.shape[1], len(groups),
        seg.data_ptr(), rows.data_ptr(), ctypes.addressof(a_ptrs), ctypes.addressof(b_ptrs),
        len(outs), widths.data_ptr(), outs_t.data_ptr(), 2,
    )  # fmt: skip


@pytest.mark.parametrize(
    "k, outs, ranks, groups, m",
    [
        # a fused q/k/v layer: three adapters, one leaving k out; rows scattered, row 9 in none
        (96, [64, 32, 32], [[8, 0, 4], [4, 4, 4], [16, 16, 16]], [[0, 5, 7], [2, 3], [1, 4, 6, 8]], 10),
        # gate/up with odd widths: columns off the tile, K off the vector width, rank 1
        (37, [45, 45], [[1, 3], [5, 0]], [[2], [0, 1, 3, 4, 5, 6]], 7),
        # one adapter, one module, many rows (a prefill chunk)
        (64, [100], [[8]], [list(range(0, 40, 2))], 41),
    ],
)  # fmt: skip
def test_kernel_equals_float64_reference(lib, k, outs, ranks, groups, m):
    x, y, weights, ref = _case(k, outs, ranks, groups, m)
    _run(lib, x, y, weights, ranks, groups, outs)
    assert torch.allclose(y.double(), ref, atol=1e-4, rtol=1e-5)


def test_ops_wrapper_on_a_column_view(lib):
    """x may be a row-strided view (the kernel takes its row stride)."""
    outs, ranks, groups = [48], [[4]], [[0, 2]]
    x, y, weights, ref = _case(32, outs, ranks, groups, 3)
    wide = torch.randn(3, 80)
    wide[:, 10:42] = x
    _run(lib, wide[:, 10:42], y, weights, ranks, groups, outs)
    assert torch.allclose(y.double(), ref, atol=1e-4, rtol=1e-5)
