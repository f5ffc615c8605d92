"""Tiny random-weight checkpoints of the families in tokenmill/model/models/, built by
transformers (no download), for parity tests against it."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.tiny_models import embedded_tokenizer

_COMMON = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
    initializer_range=0.15,
)
_MOE = dict(num_experts_per_tok=2, intermediate_size=48)

# family -> (config class, model class, config overrides)
FAMILIES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=24,
            final_logit_softcapping=3.0,
            tie_word_embeddings=True,
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            original_max_position_embeddings=96,  # the prompts and outputs stay below
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.1, 1.3, 1.6],
                "long_factor": [2.0, 3.0, 5.0, 8.0],
            },
        ),
    ),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, **_MOE)),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            num_experts=4,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            head_dim=16,
            num_hidden_layers=3,
            mlp_only_layers=[1],
            **_MOE,
        ),
    ),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(num_experts=4, **_MOE)),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        dict(
            num_local_experts=4,
            head_dim=16,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 150000.0,
                "factor": 8.0,
                "original_max_position_embeddings": 128,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
            },
            **_MOE,
        ),
    ),
}


def make_family_model(family: str, **overrides):
    """A small random model of `family`; 1-D weights (norms, biases, sinks) randomised too."""
    import transformers

    config_cls, model_cls, extra = FAMILIES[family]
    kwargs = {**_COMMON, "vocab_size": embedded_tokenizer().vocab_size, **extra, **overrides}
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(1234)
    model = getattr(transformers, model_cls)(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or name.endswith("_bias"):
                p.add_(torch.randn_like(p) * 0.2)
    if getattr(model.config, "_attn_implementation", None) != "eager":
        model.config._attn_implementation = "eager"  # HF's windows and sinks in eager masks
    return model


def save_family_folder(family: str, folder: Path, chat_template: str) -> Path:
    """make_family_model(family) as a Hugging Face folder whose tokenizer config carries
    `chat_template`."""
    from tests.tiny_models import save_hf_folder

    save_hf_folder(make_family_model(family), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
