"""Native CPU kernels against torch references; the int8 path is exact across kernels."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.kernel_builds import KERNEL_BUILDS, kernel_build
from tokenmill.kernels import ops
from tokenmill.model.linear import FloatMethod, Int8Linear, Int8Method, _quantize_rows_torch

pytestmark = pytest.mark.skipif(
    not ops.kernels_available(), reason="no C compiler for the native kernels"
)


@pytest.mark.parametrize("m", [1, 3, 17, 64])
def test_quantize_rows_bit_identical_to_torch(m):
    x = torch.randn(m, 576) * torch.logspace(-3, 2, m)[:, None]
    q, s = ops.quantize_rows(x)
    tq, ts = _quantize_rows_torch(x)
    assert torch.equal(q, tq) and torch.equal(s, ts)
    # strided rows (a column slice of a wider matrix)
    wide = torch.randn(m, 1000)
    q2, s2 = ops.quantize_rows(wide[:, 100:676])
    tq2, ts2 = _quantize_rows_torch(wide[:, 100:676].contiguous())
    assert torch.equal(q2, tq2) and torch.equal(s2, ts2)


@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (100, 33)])  # 100: not a multiple of 64
@pytest.mark.parametrize("m", [1, 2, 5, 15, 16, 40])
def test_int8_linear_native_equals_int_mm(k, n, m):
    torch.manual_seed(0)
    w = torch.randn(n, k)
    lin = Int8Linear(w, torch.randn(n), native=True)
    x = torch.randn(m, k)
    act = ops.quantize_rows(x)
    native = ops.int8_linear(*act, lin.weight, lin.weight_colsum, lin.weight_scale, lin.bias)
    acc = torch._int_mm(act[0], lin.weight.t())
    ref = acc.float().mul_(act[1]).mul_(lin.weight_scale).add_(lin.bias)
    assert torch.equal(native, ref), "integer accumulation must be exact in both kernels"
    assert torch.equal(ops.dequant_i32(acc, act[1], lin.weight_scale, lin.bias), ref)
    residual = torch.randn(m, n)
    assert torch.equal(
        ops.int8_linear(
            *act, lin.weight, lin.weight_colsum, lin.weight_scale, lin.bias, residual.clone()
        ),
        residual + ref,
    )


def test_rmsnorm_and_fused_quant():
    x = torch.randn(7, 576) * 3
    w = torch.randn(576)
    ref = F.rms_norm(x, (576,), w, 1e-5)
    assert torch.allclose(ops.rmsnorm(x, w, 1e-5), ref, atol=1e-5, rtol=1e-5)
    q, s = Int8Method().norm(x, w, 1e-5)
    dequant = q.float() * s
    assert (dequant - ref).abs().max() <= s.max() * 0.51


def test_silu_mul_quant():
    gu = torch.randn(5, 2 * 1536)
    q, s = ops.silu_mul_quant(gu)
    ref = FloatMethod().silu_mul(gu)
    assert ((q.float() * s) - ref).abs().max() <= s.max() * 0.51


def test_rope_matches_torch_rotary():
    from tokenmill.model.rotary import RotaryEmbedding, rope_inv_freq

    rope = RotaryEmbedding(64, 512, rope_inv_freq(64, 10000.0, None))
    qkv = torch.randn(9, 13 * 64)
    positions = torch.tensor([0, 1, 2, 50, 100, 7, 511, 3, 3])
    ref = rope.apply(positions, qkv[:, : 12 * 64].view(9, 12, 64))
    out = qkv.clone()
    ops.rope_neox_(out, 12, 64, positions, rope.cos, rope.sin)
    assert torch.allclose(out[:, : 12 * 64].view(9, 12, 64), ref, atol=1e-5)
    assert torch.equal(out[:, 12 * 64 :], qkv[:, 12 * 64 :]), "heads past num_heads untouched"


def test_partial_rope_turns_the_first_dims_of_each_head():
    """Phi-4's partial rotation: the tables' width sets the dims that turn (the first 48 of
    each 64-dim head here, as FamilyRotary.apply turns them); the rest are untouched."""
    from tokenmill.model.models.rope import FamilyRotary
    from tokenmill.model.rotary import RotaryEmbedding, rope_inv_freq

    full = RotaryEmbedding(48, 512, rope_inv_freq(48, 10000.0, None))
    rope = FamilyRotary(full.cos, full.sin, 64)
    qkv = torch.randn(9, 13 * 64)
    positions = torch.tensor([0, 1, 2, 50, 100, 7, 511, 3, 3])
    ref = rope.apply(positions, qkv[:, : 12 * 64].view(9, 12, 64))
    out = qkv.clone()
    ops.rope_neox_(out, 12, 64, positions, rope.cos, rope.sin)
    heads = out[:, : 12 * 64].view(9, 12, 64)
    assert torch.allclose(heads, ref, atol=1e-5)
    assert torch.equal(heads[..., 48:], qkv[:, : 12 * 64].view(9, 12, 64)[..., 48:])
    assert torch.equal(out[:, 12 * 64 :], qkv[:, 12 * 64 :])


@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("hd", [64, 128, 48])  # 48: the portable body
def test_paged_attention_decode_matches_sdpa(window, hd):
    from tokenmill.model.attention import AttentionMetadata, CPUPagedBackend, TorchSDPABackend

    nh, nkv, bs = 9, 3, 16
    torch.manual_seed(0)
    kv = torch.randn(2, 50, bs * nkv * hd)
    lens = torch.tensor([1, 17, 100, 64])
    table = torch.stack([torch.randperm(50)[:7] for _ in lens])
    q = torch.randn(len(lens), nh, hd)
    meta = AttentionMetadata(torch.empty(0, dtype=torch.long), len(lens), table, lens, [])
    native = CPUPagedBackend(nh, nkv, hd, bs, window)._decode(q, kv, meta)
    ref = TorchSDPABackend(nh, nkv, hd, bs, window)._decode(q, kv, meta)
    assert torch.allclose(native, ref, atol=1e-5)


@pytest.fixture(scope="module", params=KERNEL_BUILDS)
def attention_kernels(request):
    """Each build's decode attention: AVX-512 (where the CPU has it), AVX2, portable."""
    lib = kernel_build(request.param)

    def decode(q, kv, table, lens, nkv, bs, scale):
        b, nh, hd = q.shape
        out = torch.empty_like(q)
        lib.tm_paged_attention_decode(
            q.data_ptr(), kv.data_ptr(), kv.shape[1], table.data_ptr(), lens.data_ptr(), b, nh,
            nkv, hd, bs, table.shape[1], scale, 0, out.data_ptr(), 2,
        )  # fmt: skip
        return out

    return decode


@pytest.mark.parametrize("heads", [(9, 3), (12, 1)])  # 12 per KV head: more than one task
@pytest.mark.parametrize("base", [5, 253, 700])  # 253: the run crosses a 256-key chunk
@pytest.mark.parametrize("hd", [64, 128, 48])
def test_decode_rows_continuing_one_sequence_equal_each_row_alone(
    attention_kernels, hd, base, heads
):
    """Drafted rows of one request (same blocks, each one key longer) share their key chunks'
    tasks with the query heads of their KV head on the vector bodies: every row's output is
    bit-identical to the row computed alone, in a batch with another sequence between runs,
    and close to SDPA; in every build."""
    from tokenmill.model.attention import AttentionMetadata, TorchSDPABackend

    (nh, nkv), bs = heads, 16
    torch.manual_seed(1)
    kv = torch.randn(2, 100, bs * nkv * hd)
    first = torch.randperm(100)[:50]  # a request's blocks (its drafts' keys included)
    other = torch.randperm(100)[:50]
    rows = (
        [(first, base + i) for i in range(6)]
        + [(other, 37)]
        + [(first, base + 6 + i) for i in range(2)]
    )
    table = torch.stack([t for t, _ in rows]).contiguous()
    lens = torch.tensor([n for _, n in rows])
    q = torch.randn(len(rows), nh, hd)
    batched = attention_kernels(q, kv, table, lens, nkv, bs, hd**-0.5)
    for i in range(len(rows)):
        alone = attention_kernels(q[i : i + 1], kv, table[i : i + 1], lens[i : i + 1], nkv, bs,
                                  hd**-0.5)  # fmt: skip
        assert torch.equal(batched[i], alone[0]), i
    meta = AttentionMetadata(torch.empty(0, dtype=torch.long), len(rows), table, lens, [])
    ref = TorchSDPABackend(nh, nkv, hd, bs, None)._decode(q, kv, meta)
    assert torch.allclose(batched.reshape(ref.shape), ref, atol=1e-5)


@pytest.mark.parametrize("march", KERNEL_BUILDS)
def test_gelu_tanh_mul_is_torchs_and_the_same_in_every_build(march):
    """The one-call decoder's GELU (tanh) times up: torch's within float32 rounding, the same
    bits in every build and in a row's vector lanes and scalar tail (37 values: 2 x 16 + 5)."""
    lib = kernel_build(march)
    g = torch.Generator().manual_seed(0)
    gate_up = torch.randn(5, 74, generator=g) * torch.tensor([0.01, 1.0, 4.0, 12.0, 60.0])[:, None]
    out = torch.empty(5, 37)
    lib.tm_gelu_tanh_mul_rows(gate_up.data_ptr(), 5, 37, out.data_ptr(), 2)
    ref = F.gelu(gate_up[:, :37].double(), approximate="tanh") * gate_up[:, 37:].double()
    assert torch.allclose(out.double(), ref, rtol=2e-6, atol=1e-6), (out - ref).abs().max()
    native = torch.empty_like(out)
    kernel_build("native").tm_gelu_tanh_mul_rows(gate_up.data_ptr(), 5, 37, native.data_ptr(), 1)
    assert torch.equal(out, native)
    # one value per row at every position: lanes and tail agree
    row = gate_up[3:4].clone()
    shifted = torch.empty(1, 37)
    for j in (0, 15, 31, 36):
        row[0, :37] = gate_up[3, j]
        row[0, 37:] = 1.0
        lib.tm_gelu_tanh_mul_rows(row.data_ptr(), 1, 37, shifted.data_ptr(), 1)
        assert torch.equal(shifted, shifted[0, :1].expand(1, 37)), j


def test_a_failed_build_logs_the_compiler_s_errors_and_falls_back(tmp_path, monkeypatch, caplog):
    """The sources compile side by side, then link: a compiler that fails leaves no library
    (the engine runs pure torch) and its errors in the log, and nothing in the cache."""
    from tokenmill.kernels.build import build_kernels

    compiler = tmp_path / "cc"
    compiler.write_text("#!/bin/sh\necho \"cc: error: no room for $#\" >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path / "cache"))
    with caplog.at_level("WARNING", logger="tokenmill.kernels.build"):
        assert build_kernels("native") is None
    assert "kernel build failed" in caplog.text and "cc: error: no room for" in caplog.text
    assert not list((tmp_path / "cache").rglob("*.so"))
