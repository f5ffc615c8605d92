"""The integer-dot GEMM (prefill and batched steps on Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K blocks): every build
(this CPU, AVX2, plain x86-64) gives the plain C reference's bits at each activation precision,
a row's result does not depend on the rows beside it, the decode GEMV at the same bits gives
the same bits, and the error stays within what the activation's rounding allows."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.kernel_builds import AMX_EMULATED, KERNEL_BUILDS, kernel_build
from tests.unit.test_native_weights import (
    INT_DOT_QTYPES,
    int_dot,
    int_dot_cols,
    packed,
    quantized,
    repack,
)
from tokenmill import kernels
from tokenmill.kernels.build import build_kernels

# the largest relative rounding of an activation value per precision: half a step of the
# block's largest value (8 bits: 127 steps, 16: 32639, 24: 8355711), plus fp32's
BOUND = {8: 0.5 / 127 + 1e-6, 16: 0.5 / 32639 + 1e-6, 24: 2e-6}


@pytest.fixture(scope="module", params=[*KERNEL_BUILDS, AMX_EMULATED])
def lib(request):
    return kernel_build(request.param)


def gemm(lib, x, w, bits, bias=None, out=None, threads=2) -> torch.Tensor:
    """The build's GEMM; where it has AMX tiles (the hardware's, or AMX_EMULATED's model),
    run with them and with its AVX-512 VNNI tiles, which must give the same bits."""
    if not lib.tm_int_dot_amx_available():
        return run_gemm(lib, x, w, bits, bias, out, threads)
    both = []
    for on in (0, 1):
        lib.tm_int_dot_set_amx(on)
        both.append(run_gemm(lib, x, w, bits, bias, None if out is None else out.clone(), threads))
    torch.testing.assert_close(both[0], both[1], rtol=0, atol=0, equal_nan=True)
    return both[1] if out is None else out.copy_(both[1])


def run_gemm(lib, x, w, bits, bias=None, out=None, threads=2) -> torch.Tensor:
    accumulate = out is not None
    if out is None:
        out = torch.empty(x.shape[0], w.rows)
    repacked = repack(lib, w)  # held: the call reads it
    lib.tm_int_dot_gemm(
        x.data_ptr(), x.shape[0], x.shape[1], repacked.data_ptr(), w.qtype, w.rows,
        bias.data_ptr() if bias is not None else None, out.data_ptr(), int(accumulate), bits,
        threads,
    )  # fmt: skip
    return out


def reference(lib, x, w, bits) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.rows)
    repacked = repack(lib, w)
    lib.tm_int_dot_gemm_reference(
        x.data_ptr(), x.shape[0], x.shape[1], repacked.data_ptr(), w.qtype, w.rows,
        out.data_ptr(), bits,
    )  # fmt: skip
    return out


def rows(m: int, k: int, seed: int = 0) -> torch.Tensor:
    """Rows of very different sizes, with one block of zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-3, 2, m)[:, None]
    x[1, :32] = 0
    return x


@pytest.mark.parametrize("qtype", list(INT_DOT_QTYPES))
@pytest.mark.parametrize("bits", [8, 16, 24])
def test_gemm_is_the_plain_c_reference_in_every_build(lib, qtype, bits):
    w = packed(qtype, 48, int_dot_cols(qtype, 128))
    x = rows(29, w.cols)  # two full 12-row tiles and a partial one; 3 full 8-row tiles and 5
    ours = gemm(lib, x, w, bits)
    assert torch.equal(ours, reference(lib, x, w, bits))
    assert torch.equal(ours, gemm(build_kernels("x86-64"), x, w, bits))
    expected = x.double() @ w.dequantize().double().t()
    scale = x.abs().double() @ w.dequantize().abs().double().t()  # bound of each sum's terms
    assert ((ours.double() - expected).abs() <= BOUND[bits] * scale + 1e-30).all()
    # the decode GEMV at the same bits (8 rows a pass), this build's and the plain C one's
    gemv = int_dot(lib, x, w, bits=bits)
    assert torch.equal(ours, gemv)
    assert torch.equal(ours, int_dot(lib, x, w, reference=True, bits=bits))
    assert torch.equal(ours, int_dot(build_kernels("x86-64"), x, w, bits=bits))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1"])
@pytest.mark.parametrize("bits", [8, 16, 24])
def test_blocks_past_fp32_integers_round_as_the_reference(lib, qtype, bits):
    """Weights and activations near their blocks' largest values, of one sign within a block:
    a Q8_0 block's integer dot product (~110 x 30000 x 32, ~2^27) is past fp32's exact
    integers, so the build's and the reference's fp32 operations round it, and must round it
    alike."""
    rng = np.random.default_rng(0)
    values = rng.uniform(0.8, 1.0, (32, 256)).astype(np.float32)
    values[1::2] *= -1  # rows of both signs
    w = quantized(qtype, values)
    x = torch.from_numpy(rng.uniform(2.4, 3.0, (13, 256)).astype(np.float32))
    x[::3] *= -1
    ours = gemm(lib, x, w, bits)
    assert torch.equal(ours, reference(lib, x, w, bits))
    assert torch.equal(ours, int_dot(lib, x, w, bits=bits))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K"])
@pytest.mark.parametrize("bits", [8, 16])
def test_long_rows_over_several_row_blocks_are_the_reference(lib, qtype, bits):
    """K past 2048 (a thread's row blocks shrink to 2 tiles) and 150 rows: several row blocks,
    each ending in a partial tile, split over 2 threads."""
    w = packed(qtype, 32, 2560)
    x = rows(150, w.cols, seed=3)
    assert torch.equal(gemm(lib, x, w, bits), reference(lib, x, w, bits))


@pytest.mark.parametrize("bits", [8, 16])
def test_a_row_does_not_depend_on_the_rows_beside_it(lib, bits):
    w = packed("Q4_1", 32, 96)
    x = rows(40, 96, seed=1)
    together = gemm(lib, x, w, bits)
    order = torch.randperm(40, generator=torch.Generator().manual_seed(2))
    assert torch.equal(gemm(lib, x[order].contiguous(), w, bits), together[order])
    for r in (0, 13, 39):  # alone, and at another place of another tile
        assert torch.equal(gemm(lib, x[r : r + 1].clone(), w, bits, threads=1), together[r : r + 1])
        assert torch.equal(gemm(lib, x[r : r + 5].contiguous(), w, bits)[0], together[r])


@pytest.mark.parametrize("bits", [8, 16, 24])
def test_bias_residual_and_non_finite_rows(lib, bits):
    w = packed("Q8_0", 32, 64)
    x = rows(14, 64)
    x[3, 5], x[7, 40] = float("nan"), float("inf")
    plain = gemm(lib, x, w, bits)
    assert plain[3].isnan().all() and plain[7].isnan().all()
    finite = [r for r in range(14) if r not in (3, 7)]
    assert plain[finite].isfinite().all()
    bias, residual = torch.randn(32), torch.randn(14, 32)
    with_bias = gemm(lib, x, w, bits, bias=bias)
    assert torch.equal(with_bias[finite], (plain + bias)[finite])
    assert torch.equal(with_bias[finite], int_dot(lib, x, w, bias=bias, bits=bits)[finite])
    added = gemm(lib, x, w, bits, out=residual.clone())
    assert torch.equal(added[finite], (residual + plain)[finite])
    assert with_bias[[3, 7]].isnan().all() and added[[3, 7]].isnan().all()


# |logit - float32's logit| on the tiny model below (logits up to ~6.4), by the GEMM's
# activation bits; measured 8 bits 0.24 (mean 0.024), 16 bits 1e-3 (mean 9e-5), and the
# decode GEMV's 24 bits 1e-5
LOGIT_BOUND = {8: 0.5, 16: 5e-3}


@pytest.mark.parametrize("bits", [8, 16])
def test_native_logits_with_the_gemm_stay_near_float32(tmp_path, bits):
    """Prompt rows past 32 run the GEMM (the row limit set to any): the logits of a prefill in
    one step, in chunks, token by token (the decode GEMV), and of a prefix-cache hit stay
    within LOGIT_BOUND of the float32 method's on the same file."""
    from tests.tiny_models import make_hf_model
    from tests.unit.test_model_parity import write_gguf
    from tokenmill import LLM, SamplingParams
    from tokenmill.engine.scoring import sequence_logits

    source = make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )
    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(source, path, "Q4_1")
    args = {"kv_cache_memory_gib": 0.05}
    native = LLM(
        str(path), weights="native", int_dot_max_rows="any", int_dot_activation_bits=bits, **args
    )
    reference = LLM(str(path), weights="float32", **args)
    prompt = [(7 * i) % 900 + 20 for i in range(80)]
    for chunk in (None, 40, 1):
        ours = sequence_logits(native.engine.core, prompt, chunk_size=chunk)
        ref = sequence_logits(reference.engine.core, prompt, chunk_size=chunk)
        assert (ours - ref).abs().max().item() <= LOGIT_BOUND[bits], chunk
    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    request = [{"prompt_token_ids": prompt}]
    (expected,) = reference.generate(request, params)[0].outputs[0].logprobs
    token = next(iter(expected))  # the sampled (greedy) token
    hits = native.engine.core.kv_manager.stats.hits
    for _ in range(2):  # the second: a prefix-cache hit, its last prompt token computed alone
        (ours,) = native.generate(request, params)[0].outputs[0].logprobs
        assert abs(ours[token].logprob - expected[token].logprob) <= LOGIT_BOUND[bits]
    assert native.engine.core.kv_manager.stats.hits > hits


def test_the_amx_build_compiles_to_tile_instructions(tmp_path):
    """The AMX tiles' hardware half (the intrinsics, the tile permission), which runs only on
    AMX CPUs: built for Sapphire Rapids without a warning, the GEMM's tiles are AMX
    instructions (the AMX_EMULATED build runs the same kernel on the tiles' model)."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.skip("no gcc")
    target = ["-march=sapphirerapids"]
    if subprocess.run([cc, *target, "-E", "-x", "c", "-"], input="", capture_output=True).returncode:
        pytest.skip("this gcc does not know Sapphire Rapids")
    source = Path(kernels.__file__).parent / "csrc" / "int_dot_amx.c"
    flags = ["-O3", "-fopenmp", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror"]
    asm = tmp_path / "int_dot_amx.s"
    subprocess.run([cc, *target, *flags, "-S", str(source), "-o", str(asm)], check=True)
    text = asm.read_text()
    for op in ("ldtilecfg", "tileloadd", "tdpbssd", "tilestored", "tilerelease"):
        assert op in text, op
