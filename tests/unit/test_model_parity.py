"""Tiny random-weight models: our engine path vs Hugging Face transformers, logits and greedy tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tiny_models import embedded_metadata, make_hf_model, save_hf_folder
from tokenmill import LLM, SamplingParams
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


def check_parity(model, llm: LLM, chunk_size: int | None = None) -> None:
    core = llm.engine.core
    for prompt in PROMPTS:
        ours = sequence_logits(core, prompt, chunk_size=chunk_size)
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0].float()
        assert (ours - ref).abs().max().item() <= 1e-4, (
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


def _permute_for_gguf(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation (rotate-half -> interleaved pairs)."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf(model, path, qtype_name: str) -> None:
    import gguf
    from gguf.quants import quantize

    cfg = model.config
    qtype = gguf.GGMLQuantizationType[qtype_name]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    meta = embedded_metadata()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(meta["tokenizer.ggml.pre"])
    writer.add_token_list(meta["tokenizer.ggml.tokens"])
    writer.add_token_types(meta["tokenizer.ggml.token_type"])
    writer.add_token_merges(meta["tokenizer.ggml.merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(meta["tokenizer.chat_template"])

    names = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.q_proj.weight": "attn_q.weight",
        "self_attn.k_proj.weight": "attn_k.weight",
        "self_attn.v_proj.weight": "attn_v.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for name, tensor in model.state_dict().items():
        data = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{names[rest]}"
            if rest == "self_attn.q_proj.weight":
                data = _permute_for_gguf(data, cfg.num_attention_heads)
            elif rest == "self_attn.k_proj.weight":
                data = _permute_for_gguf(data, cfg.num_key_value_heads)
        if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gname, data.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gname, data.astype(np.float16))
        else:
            writer.add_tensor(gname, quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def gguf_source():
    return make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )


# The embedded file's format and the two formats around it run by default; the rest (the same
# code paths in gguf's dequantizer) with the slow tests.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "qtype",
    [pytest.param("F32", marks=_SLOW), "Q4_1", pytest.param("Q8_0", marks=_SLOW), pytest.param("F16", marks=_SLOW),
     pytest.param("Q4_0", marks=_SLOW), pytest.param("Q5_1", marks=_SLOW)],
)  # fmt: skip
def test_gguf_parity_with_transformers(tmp_path, qtype, gguf_source):
    """Both sides dequantize the same file; q/k permutation, names and tokenizer must agree."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_source
    path = tmp_path / f"tiny-{qtype}.gguf"
    write_gguf(src, path, qtype)
    ref = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    llm = LLM(str(path), kv_cache_memory_gib=0.05)
    check_parity(ref, llm)
    if qtype != "F32":
        return  # the tokenizer is the same in every file; transformers' GGUF conversion is slow
    hf_tok = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    text = "Tokenizers: naïve café, 12345 digits, <|im_start|>user\n  spaces\ttabs 日本語"
    assert llm.get_tokenizer().encode(text) == hf_tok.encode(text)
