"""The embedded Q4_1 file run natively (packed Q4_1 layers, packed Q8_0 lm_head) against the
same file dequantized to float32: logits within 1e-3, greedy tokens identical."""

from __future__ import annotations

import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.engine.scoring import sequence_logits

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis is the process by which plants",
]


@pytest.fixture(scope="module")
def native_llm():
    return LLM(kv_cache_memory_gib=0.25, weights="native")


def test_native_logits_match_float32(embedded_llm, native_llm):
    tok = embedded_llm.get_tokenizer()
    for text in PROMPTS:
        ids = tok.encode(text)
        for chunk in (None, 1):
            ours = sequence_logits(native_llm.engine.core, ids, chunk_size=chunk)
            ref = sequence_logits(embedded_llm.engine.core, ids, chunk_size=chunk)
            assert (ours - ref).abs().max().item() <= 1e-3, (text, chunk)


def test_native_greedy_64_tokens_identical(embedded_llm, native_llm):
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    ours = native_llm.generate(PROMPTS, params)
    ref = embedded_llm.generate(PROMPTS, params)
    for a, b in zip(ours, ref, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
