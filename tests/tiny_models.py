"""Tiny random-weight Llama-family checkpoints written by transformers, for fast reference tests."""

from __future__ import annotations

from pathlib import Path

import torch

from tokenmill.model.embedded import embedded_model_path
from tokenmill.model.gguf_file import GGUFFile
from tokenmill.model.tokenizer import tokenizer_from_gguf

_TOKENIZER_CACHE: dict[str, object] = {}


def embedded_tokenizer():
    if "tok" not in _TOKENIZER_CACHE:
        meta = GGUFFile(embedded_model_path()).metadata
        _TOKENIZER_CACHE["meta"] = meta
        _TOKENIZER_CACHE["tok"] = tokenizer_from_gguf(meta)
    return _TOKENIZER_CACHE["tok"]


def embedded_metadata() -> dict:
    embedded_tokenizer()
    return _TOKENIZER_CACHE["meta"]  # type: ignore[return-value]


def make_hf_model(kind: str = "llama", **overrides):
    """A small model whose logits are peaked enough that greedy decoding has no near-ties."""
    import transformers

    vocab = embedded_tokenizer().vocab_size
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.15,
    )
    common.update(overrides)
    cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    torch.manual_seed(1234)
    model = cls[1](cls[0](**common)).float().eval()
    if kind == "qwen2":  # default init leaves biases at zero; make them matter
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    return model


def save_hf_folder(model, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok = embedded_tokenizer()
    tok.hf.save(str(path / "tokenizer.json"))
    import json

    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "add_bos_token": False,
                "chat_template": embedded_metadata()["tokenizer.chat_template"],
            }
        )
    )
    return path
