"""The embedded Q4_1 file run natively (the default: packed Q4_1 layers, packed Q8_0 lm_head)
against the same file dequantized to float32: logits within LOGIT_BOUND, greedy tokens
identical."""

from __future__ import annotations

import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.config import KernelConfig
from tokenmill.engine.scoring import sequence_logits

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis is the process by which plants",
]


# The integer-dot kernels' activation bits set how close the logits come to the float32
# method's: 24 bits within 1e-3 (measured 7.7e-5); 16 bits (the default: each 32-value block
# rounded to 2^-15 of its largest value) within 1e-2 (measured at most 8.2e-3, mean 1e-3, on
# logits up to 36; KLD < 1e-6).
LOGIT_BOUND = {24: 1e-3, 16: 1e-2}[KernelConfig.int_dot_activation_bits]


@pytest.fixture(scope="module")
def float32_llm():
    llm = LLM(kv_cache_memory_gib=0.25, weights="float32")
    assert type(llm.engine.core.model.layers[0].qkv_proj).__name__ == "FloatLinear"
    return llm


def test_the_default_runs_the_file_natively(embedded_llm):
    model = embedded_llm.engine.core.model
    assert embedded_llm.engine.core.config.model_config.weight_format == "native"
    assert model.layers[0].qkv_proj.weight.name == "Q4_1"
    assert model.lm_head.weight.name == "Q8_0"


def test_native_logits_match_float32(embedded_llm, float32_llm):
    # One reference: the float32 model's single prefill pass. Its own token-by-token pass
    # drifts from it by up to ~1.2e-3 on an AVX-512 EPYC (fp32 summation order over 30
    # layers), so comparing decode against decode would measure the reference's noise.
    tok = embedded_llm.get_tokenizer()
    for text in PROMPTS:
        ids = tok.encode(text)
        ref = sequence_logits(float32_llm.engine.core, ids, chunk_size=None)
        for chunk in (None, 1):
            ours = sequence_logits(embedded_llm.engine.core, ids, chunk_size=chunk)
            assert (ours - ref).abs().max().item() <= LOGIT_BOUND, (text, chunk)


def test_native_greedy_64_tokens_identical(embedded_llm, float32_llm):
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    ours = embedded_llm.generate(PROMPTS, params)
    ref = float32_llm.generate(PROMPTS, params)
    for a, b in zip(ours, ref, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
