"""The embedded SmolLM2-135M (GGUF Q4_1) against Hugging Face transformers loading the same file."""

from __future__ import annotations

import torch

from tests.model.test_native_embedded import LOGIT_BOUND
from tokenmill import SamplingParams
from tokenmill.engine.scoring import sequence_logits

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "Photosynthesis is the process by which plants",
]


def test_logits_match_transformers(embedded_llm, hf_model):
    core = embedded_llm.engine.core
    tok = embedded_llm.get_tokenizer()
    for text in PROMPTS:
        ids = tok.encode(text)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0].float()
        for chunk in (None, 7):
            ours = sequence_logits(core, ids, chunk_size=chunk)
            # the integer-dot kernels' activation bits: LOGIT_BOUND
            assert (ours - ref).abs().max().item() <= LOGIT_BOUND, text


def test_greedy_64_tokens_identical_to_transformers(embedded_llm, hf_model):
    tok = embedded_llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    outs = embedded_llm.generate(PROMPTS, params)
    for text, out in zip(PROMPTS, outs, strict=True):
        ids = tok.encode(text)
        with torch.no_grad():
            ref = hf_model.generate(
                torch.tensor([ids]),
                max_new_tokens=64,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=2,
            )[0, len(ids) :].tolist()
        assert out.outputs[0].token_ids == ref, text
