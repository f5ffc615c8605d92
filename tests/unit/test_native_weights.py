"""Native GGUF weights (Q4_0, Q4_1, Q8_0 kept packed): the kernels against gguf's reference
dequantizer, in every build variant (this CPU, AVX2, plain x86-64), and whole models against
the same file dequantized to float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tiny_models import make_hf_model
from tests.unit.test_model_parity import PROMPTS, write_gguf
from tokenmill import LLM, SamplingParams
from tokenmill.engine.scoring import sequence_logits
from tokenmill.kernels.build import build_kernels
from tokenmill.model.packed import PackedWeight, cat_rows

QTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8}


def packed(qtype: str, rows: int, cols: int, seed: int = 0) -> PackedWeight:
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, cols)).astype(np.float32) * 0.1
    data = quantize(values, gguf.GGMLQuantizationType[qtype])
    return PackedWeight(QTYPES[qtype], rows, cols, torch.from_numpy(np.ascontiguousarray(data)))


def call_qlinear(lib, x, w, bias, out, accumulate):
    lib.tm_qlinear(
        x.data_ptr(), x.shape[0], x.shape[1], w.data.data_ptr(), w.qtype, w.rows,
        bias.data_ptr() if bias is not None else None, out.data_ptr(), int(accumulate), 2,
    )  # fmt: skip


@pytest.fixture(scope="module", params=["native", "haswell", "x86-64"])
def kernels(request):
    lib = build_kernels(request.param)
    if lib is None:
        pytest.skip("no C compiler")
    return lib


@pytest.mark.parametrize("qtype", list(QTYPES))
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 20])
def test_packed_linear_matches_the_reference_dequantizer(kernels, qtype, rows):
    w = packed(qtype, 72, 96, seed=rows)
    ref_w = w.dequantize()
    x = torch.randn(rows, 96)
    bias = torch.randn(72)
    out = torch.empty(rows, 72)
    call_qlinear(kernels, x, w, bias, out, accumulate=False)
    expected = x @ ref_w.t() + bias
    assert (out - expected).abs().max().item() <= 1e-5 * expected.abs().max().item() + 1e-6
    residual = torch.randn(rows, 72)
    acc = residual.clone()
    call_qlinear(kernels, x, w, None, acc, accumulate=True)
    assert torch.allclose(acc, residual + x @ ref_w.t(), atol=1e-5)


@pytest.mark.parametrize("qtype", list(QTYPES))
def test_dequantization_is_exact(kernels, qtype):
    w = packed(qtype, 40, 64, seed=7)
    out = torch.empty(40, 64)
    kernels.tm_dequant_matrix(w.data.data_ptr(), w.qtype, 40, 64, out.data_ptr(), 2)
    ref = w.dequantize()
    # one rounding (fused multiply-add) instead of two: at most an ulp apart
    assert torch.allclose(out, ref, rtol=2e-7, atol=1e-9)
    ids = torch.tensor([5, 0, 39, 5], dtype=torch.int64)
    rows = torch.empty(4, 64)
    kernels.tm_dequant_rows(w.data.data_ptr(), w.qtype, 64, ids.data_ptr(), 4, rows.data_ptr(), 2)
    assert torch.equal(rows, out[ids])


def test_fused_projections_stay_packed_when_formats_agree():
    q, k = packed("Q4_1", 8, 64, 1), packed("Q4_1", 4, 64, 2)
    fused = cat_rows([q, k])
    assert isinstance(fused, PackedWeight) and fused.rows == 12
    assert torch.equal(fused.dequantize(), torch.cat([q.dequantize(), k.dequantize()]))
    mixed = cat_rows([q, packed("Q8_0", 4, 64, 3)])  # formats differ: float
    assert isinstance(mixed, torch.Tensor) and mixed.shape == (12, 64)


# ---------------------------------------------------------------- whole models


@pytest.fixture(scope="module")
def tiny_source():
    return make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )


@pytest.mark.parametrize("qtype", list(QTYPES))
def test_native_model_matches_its_file_dequantized(tmp_path, tiny_source, qtype):
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(tiny_source, path, qtype)
    reference = LLM(str(path), kv_cache_memory_gib=0.05)
    native = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    layer = native.engine.core.model.layers[0]
    assert type(layer.qkv_proj).__name__ == "PackedLinear"
    for prompt in PROMPTS:
        for chunk in (None, 1, 7):  # GEMM path, then the fused GEMV path (<= 8 rows)
            ours = sequence_logits(native.engine.core, prompt, chunk_size=chunk)
            ref = sequence_logits(reference.engine.core, prompt, chunk_size=chunk)
            assert (ours - ref).abs().max().item() <= 1e-3, (qtype, len(prompt), chunk)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in native.generate(prompts, params)] == [
        o.outputs[0].token_ids for o in reference.generate(prompts, params)
    ]


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
        ModelConfig(weights="fp8")
