"""Native GGUF weights (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K kept packed): the kernels
against gguf's reference dequantizer, in every build variant (this CPU, AVX2, plain x86-64),
and whole models against the same file dequantized to float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.kernel_builds import KERNEL_BUILDS, kernel_build
from tests.tiny_models import make_hf_model
from tests.unit.test_model_parity import INT_DOT_BOUND, PROMPTS, write_gguf
from tokenmill import LLM, SamplingParams
from tokenmill.config import KernelConfig
from tokenmill.engine.scoring import sequence_logits
from tokenmill.kernels.build import build_kernels
from tokenmill.model.linear import NativeMethod
from tokenmill.model.packed import PACKED_TYPES, PackedStack, PackedWeight, block_values, cat_rows

QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}
MORE_QTYPES = {"Q5_0": 6, "Q5_1": 7, "Q4_K": 12, "Q6_K": 14}
ALL_QTYPES = {**QTYPES, **MORE_QTYPES}
K_QTYPES = ("Q4_K", "Q6_K")  # 256-value super-blocks; gguf-py has no quantizer for them
# the formats the integer-dot kernels run (Q4_K's sub-blocks as Q4_1 blocks; Q6_K's values as
# nibbles and 2 high bits, a scale per 16)
INT_DOT_QTYPES = {**QTYPES, "Q4_K": 12, "Q6_K": 14}


def int_dot_cols(qtype: str, cols: int) -> int:
    """A width for a test weight of this format: `cols`, or K-quants' 256-value multiple."""
    return -(-cols // 256) * 256 if qtype in K_QTYPES else cols


def repack(lib, w: PackedWeight) -> torch.Tensor:
    """w's blocks regrouped for the integer-dot kernels of `lib`."""
    out = torch.empty(lib.tm_int_dot_repacked_bytes(w.qtype, w.rows, w.cols), dtype=torch.uint8)
    lib.tm_int_dot_repack(w.data.data_ptr(), w.qtype, w.rows, w.cols, out.data_ptr())
    return out

# where a K-format block keeps its fp16 scales (d, dmin), and a size for them that keeps the
# dequantized values around 0.1 whatever the random scale and quant bytes
_K_FP16 = {"Q4_K": ((0, 2e-4), (2, 2e-3)), "Q6_K": ((208, 1e-4),)}


def random_k_blocks(qtype: str, rows: int, cols: int, rng) -> np.ndarray:
    """Random but valid K-format rows: random quant and scale bytes, small finite fp16 d/dmin."""
    nbytes = PACKED_TYPES[ALL_QTYPES[qtype]][1]
    blocks = rng.integers(0, 256, (rows * cols // 256, nbytes), dtype=np.uint8)
    for at, size in _K_FP16[qtype]:
        scale = (rng.standard_normal(len(blocks)) * size).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def quantized(qtype: str, values: np.ndarray) -> PackedWeight:
    """float32 `values` [rows, cols] quantized by gguf into a `qtype` PackedWeight."""
    import gguf
    from gguf.quants import quantize

    data = quantize(values, gguf.GGMLQuantizationType[qtype])
    rows, cols = values.shape
    return PackedWeight(ALL_QTYPES[qtype], rows, cols, torch.from_numpy(np.ascontiguousarray(data)))


def packed(qtype: str, rows: int, cols: int, seed: int = 0) -> PackedWeight:
    rng = np.random.default_rng(seed)
    if qtype in K_QTYPES:
        data = random_k_blocks(qtype, rows, cols, rng)
        return PackedWeight(
            ALL_QTYPES[qtype], rows, cols, torch.from_numpy(np.ascontiguousarray(data))
        )
    return quantized(qtype, rng.standard_normal((rows, cols)).astype(np.float32) * 0.1)


def call_qlinear(lib, x, w, bias, out, accumulate):
    lib.tm_qlinear(
        x.data_ptr(), x.shape[0], x.shape[1], w.data.data_ptr(), w.qtype, w.rows,
        bias.data_ptr() if bias is not None else None, out.data_ptr(), int(accumulate), 2,
    )  # fmt: skip


@pytest.fixture(scope="module", params=KERNEL_BUILDS)
def kernels(request):
    return kernel_build(request.param)


def test_formats_agree_with_ggml():
    import gguf

    for qtype, (name, nbytes) in PACKED_TYPES.items():
        ggml = gguf.GGMLQuantizationType(qtype)
        values, type_bytes = gguf.GGML_QUANT_SIZES[ggml]
        assert (name, nbytes, block_values(qtype)) == (ggml.name, type_bytes, values)
    assert block_values(12) == 256 and block_values(6) == 32
    PackedWeight(12, 2, 512, torch.zeros(2, 288, dtype=torch.uint8))
    with pytest.raises(ValueError, match="multiple of 256"):
        PackedWeight(12, 2, 96, torch.zeros(2, 54, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        PackedWeight(14, 2, 256, torch.zeros(2, 209, dtype=torch.uint8))


def test_the_kernels_know_every_format(kernels):
    for qtype, (_, nbytes) in PACKED_TYPES.items():
        assert kernels.tm_block_bytes(qtype) == nbytes
        assert kernels.tm_block_values(qtype) == block_values(qtype)
    assert kernels.tm_block_bytes(1) == 0 and kernels.tm_block_values(1) == 0  # F16


@pytest.mark.parametrize("qtype", list(ALL_QTYPES))
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_packed_linear_matches_the_reference_dequantizer(kernels, qtype, rows):
    cols = 512 if qtype in K_QTYPES else 96
    w = packed(qtype, 72, cols, seed=rows)
    ref_w = w.dequantize()
    x = torch.randn(rows, cols)
    bias = torch.randn(72)
    out = torch.empty(rows, 72)
    call_qlinear(kernels, x, w, bias, out, accumulate=False)
    expected = x @ ref_w.t() + bias
    assert (out - expected).abs().max().item() <= 1e-5 * expected.abs().max().item() + 1e-6
    residual = torch.randn(rows, 72)
    acc = residual.clone()
    call_qlinear(kernels, x, w, None, acc, accumulate=True)
    assert torch.allclose(acc, residual + x @ ref_w.t(), atol=1e-5)


@pytest.mark.parametrize("qtype", list(ALL_QTYPES))
def test_dequantization_is_exact(kernels, qtype):
    cols = 512 if qtype in K_QTYPES else 64
    w = packed(qtype, 40, cols, seed=7)
    out = torch.empty(40, cols)
    kernels.tm_dequant_matrix(w.data.data_ptr(), w.qtype, 40, cols, out.data_ptr(), 2)
    ref = w.dequantize()
    # Q4_1: one rounding (fused multiply-add) instead of two: at most an ulp apart
    assert torch.allclose(out, ref, rtol=2e-7, atol=1e-9)
    if qtype in MORE_QTYPES:  # separate multiplies and adds, as gguf's: bit for bit
        assert torch.equal(out, ref)
    transposed = torch.empty(cols, 40)  # 40 rows: two full tiles of 16 and a partial one
    kernels.tm_dequant_matrix_t(w.data.data_ptr(), w.qtype, 40, cols, transposed.data_ptr(), 2)
    assert torch.equal(transposed, out.t())
    ids = torch.tensor([5, 0, 39, 5], dtype=torch.int64)
    rows = torch.empty(4, cols)
    kernels.tm_dequant_rows(w.data.data_ptr(), w.qtype, cols, ids.data_ptr(), 4, rows.data_ptr(), 2)
    assert torch.equal(rows, out[ids])


# ---------------------------------------------------------------- integer-dot decode GEMV


def int_dot(lib, x, w, bias=None, out=None, reference=False, bits=24):
    """The integer-dot GEMV of `lib` on w (repacked by the same build), activations at
    `bits`."""
    repacked = repack(lib, w)
    accumulate = out is not None
    if out is None:
        out = torch.empty(x.shape[0], w.rows)
    if reference:
        lib.tm_int_dot_linear_reference(
            x.data_ptr(), x.shape[0], x.shape[1], repacked.data_ptr(), w.qtype, w.rows,
            out.data_ptr(), bits,
        )  # fmt: skip
        return out
    lib.tm_int_dot_linear(
        x.data_ptr(), x.shape[0], x.shape[1], repacked.data_ptr(), w.qtype, w.rows,
        bias.data_ptr() if bias is not None else None, out.data_ptr(), int(accumulate), bits, 2,
    )  # fmt: skip
    return out


def test_int_dot_supports_its_formats_in_groups_of_16_rows(kernels):
    for name, qtype in INT_DOT_QTYPES.items():
        cols = int_dot_cols(name, 96)
        assert kernels.tm_int_dot_supported(qtype, 48, cols), name
        assert not kernels.tm_int_dot_supported(qtype, 40, cols), name  # not a multiple of 16
    for qtype in (12, 14):  # K-quants: whole super-blocks only
        assert not kernels.tm_int_dot_supported(qtype, 48, 96)
    for name, qtype in MORE_QTYPES.items():
        assert kernels.tm_int_dot_supported(qtype, 48, 512) == (name in INT_DOT_QTYPES), name
    # regrouped bytes per 32 values and row: Q4_K 18.5 (a byte each for sc and m, fp16 d and
    # dmin per 256 values; the file's: 18), Q6_K 26.25 (6 bits a value, two int8 scales, fp16
    # d per 256: the file's), Q4_1 its own 20
    assert kernels.tm_int_dot_repacked_bytes(12, 32, 512) == 32 * 16 * 18.5
    assert kernels.tm_int_dot_repacked_bytes(14, 32, 512) == 32 * 16 * 26.25
    assert kernels.tm_int_dot_repacked_bytes(3, 32, 512) == 32 * 16 * 20


@pytest.mark.parametrize("qtype", K_QTYPES)
def test_k_quants_regrouped_are_the_dequantized_weight(kernels, qtype):
    """Q4_K sub-blocks regrouped as Q4_1 blocks (scale d * sc, minimum -(dmin * m)) and Q6_K's
    6-bit values with a d * sc per 16 values hold ggml's values: the GEMV on one-hot rows
    reads back gguf's dequantized weight (within fp32 roundings of terms of the weights'
    size)."""
    w = packed(qtype, 32, 512, seed=5)
    eye = torch.eye(512)[::7].contiguous()  # every sub-block and nibble half, 74 rows
    got = torch.cat([int_dot(kernels, eye[i : i + 8].contiguous(), w) for i in range(0, 74, 8)])
    expected = w.dequantize()[:, ::7].t()
    assert (got - expected).abs().max() <= 1e-6 * expected.abs().max()


@pytest.mark.parametrize("qtype", list(INT_DOT_QTYPES))
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_int_dot_is_exact_but_for_the_24_bit_activation(kernels, qtype, rows):
    """Against float64 on the exactly dequantized weight: the error stays at fp32's order
    (24-bit activation digits); every build gives the plain C reference's bits, and a row's
    result does not depend on the rows run with it."""
    cols = int_dot_cols(qtype, 160)
    w = packed(qtype, 48, cols, seed=rows)
    x = torch.randn(rows, cols) * torch.logspace(-3, 3, cols)  # blocks of very different scales
    x[0, :32] = 0.0  # an all-zero block
    expected = x.double() @ w.dequantize().double().t()
    ours = int_dot(kernels, x, w)
    scale = x.abs().double() @ w.dequantize().abs().double().t()  # bound of each sum's terms
    assert ((ours.double() - expected).abs() <= 2e-6 * scale + 1e-30).all()
    assert torch.equal(ours, int_dot(kernels, x, w, reference=True))
    assert torch.equal(ours, int_dot(build_kernels("x86-64"), x, w))
    for r in range(rows):
        assert torch.equal(ours[r : r + 1], int_dot(kernels, x[r : r + 1].clone(), w))
    bias, residual = torch.randn(48), torch.randn(rows, 48)
    assert torch.equal(int_dot(kernels, x, w, bias=bias), ours + bias)
    assert torch.equal(int_dot(kernels, x, w, out=residual.clone()), residual + ours)


def test_int_dot_activation_rounding_is_the_same_in_every_build(kernels):
    """Blocks whose scale is exactly 1 (largest value 8355711): the halves in between round to
    even, as rintf does in the plain C build; the digits' edges (+-127 per byte) included."""
    w = packed("Q8_0", 32, 128)
    x = torch.zeros(3, 128)
    x[:, 0] = 8355711.0
    x[0, 1:32] = torch.arange(1, 32) + 0.5  # ties up
    x[0, 32:64] = -(torch.arange(32) + 0.5) * 3  # ties down, other blocks' scales differ
    x[1, 1:32] = torch.tensor([127.5, -127.5, 32767.5, -32767.5, 8355710.5, -8355710.5] * 5 + [0.5])
    x[2] = torch.randn(128) * 1e-30  # subnormal-scale blocks
    ours = int_dot(kernels, x, w)
    assert torch.equal(ours, int_dot(build_kernels("x86-64"), x, w))
    assert torch.equal(ours, int_dot(kernels, x, w, reference=True))


def test_int_dot_passes_non_finite_activations_on(kernels):
    w = packed("Q4_1", 16, 64)
    x = torch.randn(3, 64)
    x[0, 3], x[1, 40], x[2, 5] = float("nan"), float("inf"), 1e30  # large but finite: kept
    y = int_dot(kernels, x, w)
    assert y[0].isnan().all() and y[1].isnan().all()
    assert y[2].isfinite().all()
    expected = x[2].double() @ w.dequantize().double().t()
    assert torch.allclose(y[2].double(), expected, rtol=1e-5)


def test_packed_linear_uses_int_dot_for_decode_rows_where_it_can():
    from tokenmill.kernels import ops
    from tokenmill.model.linear import PackedLinear

    for name in INT_DOT_QTYPES:
        w = packed(name, 32, int_dot_cols(name, 96))
        x = torch.randn(3, w.cols)
        linear = PackedLinear(w, None)
        assert (linear.int_dot is not None) == (ops.int_dot_kind() > 0), name
        exact = x.double() @ w.dequantize().double().t()
        scale = x.abs().double() @ w.dequantize().abs().double().t()  # bound of each sum's terms
        # within 16-bit activations' half step of 32639 per block's largest value (24 bits,
        # the default, round finer)
        assert ((linear(x).double() - exact).abs() <= 2e-5 * scale).all(), name
    assert PackedLinear(packed("Q4_1", 40, 96), None).int_dot is None  # 40 rows: fp32 GEMV
    assert PackedLinear(packed("Q5_1", 32, 96), None).int_dot is None
    # KernelConfig.int_dot off (--no-int-dot, $TOKENMILL_INT_DOT=0): the fp32 GEMV
    assert PackedLinear(packed("Q4_1", 32, 96), None, int_dot=False).int_dot is None


def int_dot_argmax(lib, x, w, bits=24):
    """tm_int_dot_argmax of `lib` on w at `bits`, with its bound table (same build)."""
    repacked = repack(lib, w)
    bounds = torch.empty(w.rows // 16 * (w.cols // 32 + 1))
    lib.tm_int_dot_bound_table(repacked.data_ptr(), w.qtype, w.rows, w.cols, bounds.data_ptr())
    out = torch.empty(x.shape[0], dtype=torch.int64)
    lib.tm_int_dot_argmax(
        x.data_ptr(), x.shape[0], x.shape[1], repacked.data_ptr(), w.qtype, w.rows,
        bounds.data_ptr(), out.data_ptr(), bits, 2,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("qtype", list(INT_DOT_QTYPES))
def test_greedy_argmax_is_the_argmax_of_the_full_outputs(kernels, qtype, bits):
    """The high-byte estimate + exact candidates give the index of the largest output the
    full GEMV computes at the same activation bits, bit for bit: outlier blocks, near-ties
    that only the low planes tell apart, exact ties (duplicate weight rows: the first wins),
    1 to 70 rows."""
    gen = torch.Generator().manual_seed(7)
    cols = int_dot_cols(qtype, 192)
    w = packed(qtype, 256, cols, seed=3)
    rows = w.data.clone()
    # rows 31 and 99 get the two largest rows (K-quant test rows' scales differ widely), their
    # places other rows
    first, second = w.dequantize().norm(dim=1).topk(2).indices.tolist()
    rows[31], rows[99] = w.data[first], w.data[second]
    rows[first], rows[second] = w.data[0], w.data[1]
    rows[200], rows[57] = rows[31], rows[31]  # three equal rows: a tie whenever row 31 wins
    # row 100 = row 99 but for value 0 (one quantum apart): with x[0] far below its block's
    # largest value, only the low byte planes tell the two apart
    head = {"Q4_0": 2, "Q4_1": 4, "Q8_0": 2, "Q4_K": 16, "Q6_K": 0}[qtype]
    rows[100] = rows[99]
    rows[100, head] ^= 8 if qtype in K_QTYPES else 1  # K: 8 quanta (sub-block steps are small)
    w = PackedWeight(w.qtype, w.rows, w.cols, rows)
    dense = w.dequantize()
    xs = [torch.randn(12, cols, generator=gen) * torch.logspace(-2, 2, cols)]
    x = torch.randn(12, cols, generator=gen)
    x[:, 64:96] *= 300.0  # an outlier block: its estimate error dwarfs the others'
    xs.append(x)
    # rows aimed at weight row 31 (and its copies): the tie and its near misses; aimed at the
    # row less what all rows share (K-quant rows share a large minimum term)
    common = dense.mean(0)
    aimed = (dense[31] - common).repeat(12, 1) + 1e-4 * torch.randn(12, cols, generator=gen)
    xs.append(aimed)
    near = (dense[99] - common).repeat(12, 1) + 1e-3 * torch.randn(12, cols, generator=gen)
    near[:, 0] = torch.linspace(-1e-3, 1e-3, 12) * near[:, :32].abs().amax(1)
    xs.append(near)
    for x in xs:
        full = int_dot(kernels, x, w, bits=bits).max(dim=1).indices
        for m in (1, 3, 8, 12):
            got = int_dot_argmax(kernels, x[:m].contiguous(), w, bits)
            assert torch.equal(got, full[:m]), (m, got, full[:m])
    assert int(int_dot_argmax(kernels, aimed[:1].contiguous(), w, bits)) == 31  # first of the tie
    tie = int_dot(kernels, aimed, w, bits=bits)
    winners = tie.max(dim=1).indices
    assert torch.equal(int_dot_argmax(kernels, aimed, w, bits), winners)
    assert all(tie[i, 31] == tie[i, 57] == tie[i, 200] for i in range(12))
    # past one block of rows (64 quantized together): each row's index is still its own
    many = torch.cat([*xs, torch.randn(70 - 4 * 12, cols, generator=gen)])
    full = int_dot(kernels, many, w, bits=bits).max(dim=1).indices
    assert torch.equal(int_dot_argmax(kernels, many, w, bits), full)
    close = int_dot(kernels, near, w, bits=bits)
    if bits > 8:  # 8 bits cannot tell the two apart
        assert set(close.max(dim=1).indices.tolist()) == {99, 100}  # both win somewhere


def test_greedy_argmax_gives_up_on_non_finite_outputs(kernels):
    w = packed("Q8_0", 32, 64)
    x = torch.randn(3, 64)
    x[1, 5] = float("nan")
    x[2, 9] = float("inf")
    got = int_dot_argmax(kernels, x, w)
    assert got[0] == int_dot(kernels, x[:1].contiguous(), w).max(dim=1).indices[0]
    assert got[1] == -1 and got[2] == -1


def test_packed_linear_greedy_argmax_runs_where_its_int_dot_does(monkeypatch):
    from tokenmill.kernels import ops
    from tokenmill.model.linear import INT_DOT_MAX_ROWS, PackedLinear

    w = packed("Q8_0", 64, 96)
    linear = PackedLinear(w, None)
    x = torch.randn(5, 96)
    if ops.int_dot_kind() == 0:
        assert linear.greedy_argmax(x) is None
        return
    assert torch.equal(linear.greedy_argmax(x), linear(x).max(dim=1).indices)
    many = torch.randn(INT_DOT_MAX_ROWS + 1, 96)  # the GEMM computes these: no shortcut
    assert linear.greedy_argmax(many) is None
    assert PackedLinear(w, torch.randn(64)).greedy_argmax(x) is None  # a bias: not handled
    x[2, 0] = float("nan")
    assert linear.greedy_argmax(x) is None


def test_fused_projections_stay_packed_when_formats_agree():
    q, k = packed("Q4_1", 8, 64, 1), packed("Q4_1", 4, 64, 2)
    fused = cat_rows([q, k])
    assert isinstance(fused, PackedWeight) and fused.rows == 12
    assert torch.equal(fused.dequantize(), torch.cat([q.dequantize(), k.dequantize()]))
    v = packed("Q8_0", 4, 64, 3)
    mixed = cat_rows([q, v])  # formats differ: each part stays packed in its own
    assert isinstance(mixed, PackedStack) and mixed.shape == (12, 64)
    linear = NativeMethod().linear(mixed, torch.arange(12.0))
    assert type(linear).__name__ == "StackedPackedLinear"
    x = torch.randn(3, 64)
    expected = x @ torch.cat([q.dequantize(), v.dequantize()]).t() + torch.arange(12.0)
    assert torch.allclose(linear(x), expected, atol=1e-5)
    assert isinstance(cat_rows([q, torch.zeros(4, 64)]), torch.Tensor)  # packed + float


# ---------------------------------------------------------------- whole models


@pytest.fixture(scope="module")
def tiny_source():
    return make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )


@pytest.mark.parametrize(
    "qtype",
    # Q4_1 (the embedded file's format) by default; every format's kernels are tested above
    [pytest.param(q, marks=[] if q == "Q4_1" else [pytest.mark.slow]) for q in QTYPES],
)
def test_native_model_matches_its_file_dequantized(tmp_path, tiny_source, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(tiny_source, path, qtype)
    reference = LLM(str(path), kv_cache_memory_gib=0.05, weights="float32")
    native = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    assert type(reference.engine.core.model.layers[0].qkv_proj).__name__ == "FloatLinear"
    layer = native.engine.core.model.layers[0]
    assert type(layer.qkv_proj).__name__ == "PackedLinear"
    for prompt in PROMPTS:
        for chunk in (None, 1, 7):  # GEMM path, then the fused GEMV path (<= 8 rows)
            ours = sequence_logits(native.engine.core, prompt, chunk_size=chunk)
            ref = sequence_logits(reference.engine.core, prompt, chunk_size=chunk)
            bound = max(INT_DOT_BOUND, 1e-3)  # the default activation bits' bound
            assert (ours - ref).abs().max().item() <= bound, (qtype, len(prompt), chunk)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in native.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in reference.generate(prompts, params)
    ]


# A mix of every newer format (as llama.cpp's K-quant files mix them), in a model wide enough
# for 256-value super-blocks: each format runs in some projection, on both paths.
MIXED_FORMATS = {
    "token_embd": "Q5_0",
    "output": "Q6_K",
    "blk.0.attn_q": "Q4_K",
    "blk.0.attn_k": "Q4_K",
    "blk.0.attn_v": "Q4_K",
    "blk.0.attn_output": "Q5_1",
    "blk.0.ffn_gate": "Q4_K",
    "blk.0.ffn_up": "Q4_K",
    "blk.0.ffn_down": "Q6_K",
    "blk.1.attn_q": "Q5_0",
    "blk.1.attn_k": "Q5_0",
    "blk.1.attn_v": "Q5_0",
    "blk.1.attn_output": "Q6_K",
    "blk.1.ffn_gate": "Q5_1",
    "blk.1.ffn_up": "Q5_1",
    "blk.1.ffn_down": "Q4_K",
}


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """[n, 256] fp32 -> [n, 144] Q4_K blocks: per 32-value sub-block an unsigned 4-bit code
    with a 6-bit scale and minimum (a simple quantizer, not llama.cpp's search)."""
    n = x.shape[0]
    sub = x.reshape(n, 8, 32)
    low = np.minimum(sub.min(-1), 0)
    scale = (sub.max(-1) - low) / 15
    d = (scale.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (-low.min(-1, keepdims=True) / 63).astype(np.float16)
    sc = np.clip(np.round(scale / d.astype(np.float32)), 1, 63).astype(np.uint8)
    mn = np.clip(np.round(-low / dmin.astype(np.float32)), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32) * sc)[..., None]
    offset = (dmin.astype(np.float32) * mn)[..., None]
    q = np.clip(np.round((sub + offset) / step), 0, 15).astype(np.uint8)
    scales = np.concatenate(  # ggml's get_scale_min_k4 layout
        [
            sc[:, :4] | (sc[:, 4:] >> 4) << 6,
            mn[:, :4] | (mn[:, 4:] >> 4) << 6,
            (sc[:, 4:] & 0x0F) | (mn[:, 4:] & 0x0F) << 4,
        ],
        axis=1,
    )
    qs = (q[:, 0::2] | q[:, 1::2] << 4).reshape(n, 128)  # sub-blocks 2i, 2i + 1 share bytes
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), scales, qs], axis=1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """[n, 256] fp32 -> [n, 210] Q6_K blocks: a signed 6-bit code per value, an int8 scale per
    16 values."""
    n = x.shape[0]
    groups = x.reshape(n, 16, 16)
    scale = np.abs(groups).max(-1) / 31
    d = (scale.max(-1, keepdims=True) / 127).astype(np.float16)
    sc = np.clip(np.round(scale / d.astype(np.float32)), 1, 127).astype(np.int8)
    step = (d.astype(np.float32) * sc)[..., None]
    q = (np.clip(np.round(groups / step), -32, 31) + 32).astype(np.uint8).reshape(n, 2, 4, 32)
    # value 128h + 32t + j: low nibble in ql[64h + 32(t % 2) + j] >> 4(t / 2), high 2 bits in
    # qh[32h + j] >> 2t
    ql = ((q[:, :, :2] & 0x0F) | (q[:, :, 2:] & 0x0F) << 4).reshape(n, 128)
    qh = q[:, :, 0] >> 4 | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), d.view(np.uint8)], axis=1)


def quantize_any(x: np.ndarray, qtype: str) -> np.ndarray:
    import gguf
    from gguf.quants import quantize

    if qtype == "Q4_K":
        return quantize_q4_k(x.reshape(-1, 256)).reshape(x.shape[0], -1)
    if qtype == "Q6_K":
        return quantize_q6_k(x.reshape(-1, 256)).reshape(x.shape[0], -1)
    return quantize(x, gguf.GGMLQuantizationType[qtype])


@pytest.mark.parametrize("qtype", K_QTYPES)
def test_the_test_quantizers_write_what_gguf_reads(qtype):
    """Their blocks, read back by gguf's dequantizer, are the input to within a step."""
    import gguf
    from gguf.quants import dequantize

    x = np.random.default_rng(0).standard_normal((16, 512)).astype(np.float32) * 0.1
    back = dequantize(quantize_any(x, qtype), gguf.GGMLQuantizationType[qtype])
    step = {"Q4_K": 1 / 15, "Q6_K": 1 / 62}[qtype] * 2 * np.abs(x).max()
    assert np.abs(back - x).max() <= step and np.abs(back - x).mean() <= step / 4


def write_mixed_gguf(model, path, formats: dict[str, str]) -> None:
    """write_gguf's file with each 2-D tensor in formats[its GGUF name without ".weight"]."""
    import gguf

    class Writer(gguf.GGUFWriter):
        def add_tensor(self, name, tensor, *args, raw_dtype=None, **kwargs):
            qtype = formats.get(name.removesuffix(".weight")) if tensor.ndim == 2 else None
            if qtype is None or raw_dtype is not None:
                return super().add_tensor(name, tensor, *args, raw_dtype=raw_dtype, **kwargs)
            data = quantize_any(tensor, qtype)
            return super().add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFWriter", Writer)
        write_gguf(model, path, "F32")  # every 2-D tensor goes through Writer.add_tensor


@pytest.mark.slow  # the kernel tests above cover each of these formats
def test_native_model_in_the_newer_formats_matches_its_file_dequantized(tmp_path):
    from gguf import GGUFReader

    source = make_hf_model(
        "llama",
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    path = tmp_path / "tiny-mixed.gguf"
    write_mixed_gguf(source, path, MIXED_FORMATS)
    stored = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    assert {f"{k}.weight": v for k, v in MIXED_FORMATS.items()}.items() <= stored.items()
    reference = LLM(str(path), kv_cache_memory_gib=0.05, weights="float32")
    native = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    assert type(reference.engine.core.model.lm_head).__name__ == "FloatLinear"
    model = native.engine.core.model
    linears = [model.lm_head] + [
        getattr(layer, proj)
        for layer in model.layers
        for proj in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
    ]
    assert all(type(lin).__name__ == "PackedLinear" for lin in linears)
    assert {lin.weight.name for lin in linears} == set(MORE_QTYPES)
    # by the integer-dot kernels' activation bits (hidden 256; measured 1.9e-3 at 16 bits)
    bound = {24: 1e-3, 16: 5e-3}[KernelConfig.int_dot_activation_bits]
    for prompt in PROMPTS:
        for chunk in (None, 1, 7):  # GEMM path, then the fused GEMV path (<= 8 rows)
            tokens = prompt[:16] if chunk == 1 else prompt  # a token at a time: fewer of them
            ours = sequence_logits(native.engine.core, tokens, chunk_size=chunk)
            ref = sequence_logits(reference.engine.core, tokens, chunk_size=chunk)
            assert (ours - ref).abs().max().item() <= bound, (len(tokens), chunk)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in native.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in reference.generate(prompts, params)
    ]


@pytest.mark.parametrize(
    "qtype",
    # the default format here; the integer-dot kernel tests above cover every format
    [pytest.param(q, marks=[] if q == "Q4_1" else [pytest.mark.slow]) for q in QTYPES],
)
def test_fused_decode_equals_the_per_layer_path(tmp_path, tiny_source, qtype, monkeypatch):
    """Decode steps run every layer in one native call (fused_decode.py) when every projection
    has the integer-dot GEMV: the same kernels in the same order as the per-layer path."""
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(tiny_source, path, qtype)
    fused = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    monkeypatch.setenv("TOKENMILL_FUSED_DECODE", "0")
    per_layer = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    reference = LLM(str(path), kv_cache_memory_gib=0.05, weights="float32")
    monkeypatch.delenv("TOKENMILL_FUSED_DECODE")
    calls = []
    model = fused.engine.core.model
    original = model._fused_decoder

    def spy(*args):
        decoder = original(*args)
        calls.append(decoder is not None)
        return decoder

    model._fused_decoder = spy
    for prompt in PROMPTS:
        a = sequence_logits(fused.engine.core, prompt, chunk_size=1)  # all single-token rows
        b = sequence_logits(per_layer.engine.core, prompt, chunk_size=1)
        ref = sequence_logits(reference.engine.core, prompt, chunk_size=1)
        assert torch.equal(a, b), qtype  # the same kernels, SiLU included (poly_expf)
        assert (a - ref).abs().max().item() <= max(INT_DOT_BOUND, 1e-3), qtype
    assert calls and all(calls)
    assert per_layer.engine.core.model._fused is None
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in fused.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in per_layer.generate(prompts, params)
    ]


@pytest.mark.parametrize("sequences", [12, 40])  # within / past INT_DOT_MAX_ROWS
def test_fused_decode_of_many_rows_runs_the_gemm_with_the_per_layer_bits(
    tmp_path, tiny_source, monkeypatch, sequences
):
    """Decode steps past the GEMV's 8 rows run in the one native call too (its projections on
    the integer-dot GEMM, as the per-layer path's): 12 and 40 greedy sequences give the
    per-layer path's tokens and log-probabilities bit for bit."""
    from tokenmill.model import fused_decode

    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(tiny_source, path, "Q4_1")
    monkeypatch.setenv("TOKENMILL_INT_DOT_MAX_ROWS", "any")  # every step on the integer-dot
    kw = dict(kv_cache_memory_gib=0.05, weights="native", max_num_seqs=48)
    fused = LLM(str(path), **kw)
    monkeypatch.setenv("TOKENMILL_FUSED_DECODE", "0")
    per_layer = LLM(str(path), **kw)
    monkeypatch.delenv("TOKENMILL_FUSED_DECODE")
    rows = []
    forward = fused_decode.FusedDecoder.forward
    monkeypatch.setattr(fused_decode.FusedDecoder, "forward",
                        lambda self, h, *a: rows.append(h.shape[0]) or forward(self, h, *a))  # fmt: skip
    prompts = [{"prompt_token_ids": PROMPTS[i % len(PROMPTS)][: 3 + i % 5] + [i + 5]}
               for i in range(sequences)]  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    got, want = fused.generate(prompts, params), per_layer.generate(prompts, params)
    assert max(rows) == sequences
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs


def test_fused_decode_needs_every_projection_on_the_integer_dot_gemv(tmp_path, tiny_source):
    path = tmp_path / "tiny-Q5_1.gguf"
    write_gguf(tiny_source, path, "Q5_1")  # no integer-dot GEMV for Q5_1
    llm = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    llm.generate([{"prompt_token_ids": PROMPTS[0]}], SamplingParams(max_tokens=4))
    assert llm.engine.core.model._fused is None


def test_native_batch_of_32_matches_alone(tmp_path, tiny_source):
    from tests.unit.test_invariance import mixed_prompts, run_checked

    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(tiny_source, path, "Q4_1")
    prompts = mixed_prompts(32, seed=3)
    alone = LLM(str(path), kv_cache_memory_gib=0.1, max_num_seqs=1, weights="native")
    batched = LLM(str(path), kv_cache_memory_gib=0.1, max_num_seqs=32, weights="native")
    assert run_checked(batched, prompts) == [run_checked(alone, [p])[0] for p in prompts]


def test_weights_flag_and_the_older_spelling_cannot_both_be_given():
    from tokenmill.config import ModelConfig

    assert ModelConfig(quantization="int8").weight_format == "int8"
    assert ModelConfig(dtype="bfloat16").weight_format == "bfloat16"
    assert ModelConfig(weights="native").weight_format == "native"
    with pytest.raises(ValueError, match="weights"):
        ModelConfig(weights="native", dtype="bfloat16")
    with pytest.raises(ValueError, match="weights"):
        ModelConfig(weights="fp4")


def test_batched_rows_with_and_without_the_float_copy(tmp_path, tiny_source, monkeypatch):
    """Many rows run a float32 GEMM on the dequantized weight (past the integer-dot kernel's
    32 rows, its limit where this machine did not measure it faster: set here): kept beside
    the packed one (the default dequant cache) or dequantized in chunks per call (no cache):
    same logits, both next to the float32 method's; decode rows read the packed weights
    either way."""
    monkeypatch.setenv("TOKENMILL_INT_DOT_MAX_ROWS", "32")
    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(tiny_source, path, "Q4_1")
    cached = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    uncached = LLM(str(path), kv_cache_memory_gib=0.05, weights="native", dequant_cache_gib=0)
    reference = LLM(str(path), kv_cache_memory_gib=0.05, weights="float32")
    assert cached.engine.core.model.layers[0].qkv_proj.float_linear is not None
    assert uncached.engine.core.model.layers[0].qkv_proj.float_linear is None
    for prompt in PROMPTS:
        a = sequence_logits(cached.engine.core, prompt)
        b = sequence_logits(uncached.engine.core, prompt)
        ref = sequence_logits(reference.engine.core, prompt)
        if len(prompt) > 8:  # batched rows: the same GEMM on the same float weights
            assert torch.equal(a, ref), len(prompt)
        assert (a - ref).abs().max().item() <= max(INT_DOT_BOUND, 1e-3)
        assert (b - ref).abs().max().item() <= max(INT_DOT_BOUND, 1e-3)
