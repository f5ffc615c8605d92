"""Tiny random-weight models: our engine path vs Hugging Face transformers, logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch

from tests.family_gguf import write_family_gguf
from tests.tiny_models import make_hf_model, save_hf_folder
from tokenmill import LLM, SamplingParams
from tokenmill.config import KernelConfig
from tokenmill.engine.scoring import sequence_logits

PROMPTS = [
    [5, 17, 923, 4411, 88, 301, 12, 7],
    list(range(100, 160)),
    [42],
]


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=n,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def check_parity(model, llm: LLM, chunk_size: int | None = None, bound: float = 1e-4) -> None:
    core = llm.engine.core
    for prompt in PROMPTS:
        ours = sequence_logits(core, prompt, chunk_size=chunk_size)
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0].float()
        assert (ours - ref).abs().max().item() <= bound, (
            f"logits differ for prompt of {len(prompt)} tokens"
        )
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
    )
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(model, prompt, 24)


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True}),
        (
            "llama",
            {
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 32,
                },
                "rope_theta": 500000.0,
            },
        ),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2", {}),
        ("mistral", {"sliding_window": 16}),
    ],
    ids=["llama", "tied", "llama3-rope", "linear-rope", "qwen2-bias", "mistral-sliding"],
)
def test_safetensors_parity(tmp_path, kind, overrides):
    model = make_hf_model(kind, **overrides)
    if kind == "mistral":
        model.config._attn_implementation = (
            "eager"  # HF applies the sliding window in eager/sdpa masks
        )
    path = save_hf_folder(model, tmp_path / kind)
    llm = LLM(str(path), kv_cache_memory_gib=0.05, max_num_batched_tokens=64)
    check_parity(model, llm)
    check_parity(model, llm, chunk_size=5)


# ------------------------------------------------------------------ GGUF written here, read by both


def write_gguf(model, path, qtype_name: str) -> None:
    """A Llama model as llama.cpp's converter writes it (q/k rows permuted)."""
    write_family_gguf(model, "llama", path, qtype_name)


# Q4_0 / Q4_1 / Q8_0 run the integer-dot kernels (native weights), whose activations are
# rounded to KernelConfig.int_dot_activation_bits: at 24 bits logits within the float
# formats' 1e-4 of the dequantized float32 model's (measured 1.7e-5); at 16 bits (the default:
# steps of 2^-15 of a block's largest value) within 2e-3 on these tiny models (logits up to ~6;
# measured at most 1.15e-3 over the three formats, whole prompts, chunks of 7, token by token).
INT_DOT_FORMATS = ("Q4_0", "Q4_1", "Q8_0")
INT_DOT_BOUNDS = {24: 1e-4, 16: 2e-3}
INT_DOT_BOUND = INT_DOT_BOUNDS[KernelConfig.int_dot_activation_bits]


@pytest.fixture(scope="module")
def gguf_source():
    return make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )


# The embedded file's format and the two formats around it run by default; the rest (the same
# code paths in gguf's dequantizer) with the slow tests.
_SLOW = pytest.mark.slow


# bits: the integer-dot kernels' activation bits (None: the default); Q4_1 at 24 bits keeps the
# float32 method's logits up to fp32 rounding (--int-dot-activation-bits 24)
@pytest.mark.parametrize(
    ("qtype", "bits"),
    [pytest.param("F32", None, marks=_SLOW), ("Q4_1", None), ("Q4_1", 24),
     pytest.param("Q8_0", None, marks=_SLOW), pytest.param("F16", None, marks=_SLOW),
     pytest.param("Q4_0", None, marks=_SLOW), pytest.param("Q5_1", None, marks=_SLOW)],
)  # fmt: skip
def test_gguf_parity_with_transformers(tmp_path, qtype, bits, gguf_source):
    """Both sides dequantize the same file; q/k permutation, names and tokenizer must agree."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_source
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(src, path, qtype)
    ref = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    llm = LLM(str(path), kv_cache_memory_gib=0.05, int_dot_activation_bits=bits)
    bound = INT_DOT_BOUNDS[bits or KernelConfig.int_dot_activation_bits]
    check_parity(ref, llm, bound=bound if qtype in INT_DOT_FORMATS else 1e-4)
    if qtype != "F32":
        return  # the tokenizer is the same in every file; transformers' GGUF conversion is slow
    hf_tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    text = "Tokenizers: naïve café, 12345 digits, <|im_start|>user\n  spaces\ttabs 日本語"
    assert llm.get_tokenizer().encode(text) == hf_tok.encode(text)
