"""--dtype bfloat16: bf16 linear layers (fp32 accumulation and everything else) stay close to
float32 — and are really bf16, not float32 under another name."""

from __future__ import annotations

import pytest
import torch

from tokenmill.engine.arg_utils import build_engine_config
from tokenmill.engine.core import EngineCore
from tokenmill.engine.scoring import sequence_logits
from tokenmill.model.linear import BFloat16Linear, BFloat16Method, packed_bf16_available


def test_bfloat16_logits_close_to_float32(tiny_llama_dir):
    ref = EngineCore(build_engine_config(str(tiny_llama_dir), kv_cache_memory_gib=0.05))
    test = EngineCore(
        build_engine_config(str(tiny_llama_dir), kv_cache_memory_gib=0.05, dtype="bfloat16")
    )
    assert isinstance(test.model.method, BFloat16Method)
    assert isinstance(test.model.lm_head, BFloat16Linear)
    assert test.model.lm_head.weight.dtype == torch.bfloat16
    ids = list(range(30, 130))
    ref_lp = sequence_logits(ref, ids).log_softmax(-1)
    test_lp = sequence_logits(test, ids).log_softmax(-1)
    assert test_lp.dtype == torch.float32
    kld = (ref_lp.exp() * (ref_lp - test_lp)).sum(-1)
    assert not torch.equal(ref_lp, test_lp)  # the GEMMs did run in bf16
    assert kld.mean().item() < 1e-3 and kld.max().item() < 1e-2
    same_top = (ref_lp.argmax(-1) == test_lp.argmax(-1)).float().mean().item()
    assert same_top > 0.9


@pytest.mark.parametrize("packed", [True, False])
def test_packed_and_plain_bf16_linear_agree_with_float_math(packed):
    if packed and not packed_bf16_available():
        pytest.skip("oneDNN has no native bf16 on this CPU")
    torch.manual_seed(0)
    weight, bias = torch.randn(300, 64), torch.randn(300)
    layer = BFloat16Linear(weight, bias, packed)
    for rows in (1, 7, 40):
        x = torch.randn(rows, 64)
        residual = torch.randn(rows, 300)
        product = x.bfloat16().float() @ weight.bfloat16().float().t()
        got = layer(x, residual.clone())
        assert got.dtype == torch.float32 and got.shape == (rows, 300)
        # the product is rounded to bf16 (half an ulp: 2^-8 relative), the sums are fp32
        assert torch.allclose(got - bias - residual, product, rtol=2**-7, atol=1e-3)
        assert not torch.allclose(got - bias - residual, product, rtol=0, atol=1e-6)


def test_unknown_dtype_is_rejected():
    with pytest.raises(ValueError, match="dtype"):
        build_engine_config(None, dtype="float16")
