"""A config.json or GGUF header with missing or inconsistent fields is a ValueError that names
the field, for every family (never a KeyError or a crash later)."""

from __future__ import annotations

import pytest

from tests.family_models import make_family_model
from tokenmill.model.arch_config import ArchConfig


def _config(family: str) -> dict:
    from tokenmill.model.arch_families import HF_ARCHITECTURES

    cfg = make_family_model(family).config.to_dict()
    arch = next(a for a, f in HF_ARCHITECTURES.items() if f == family)
    return {**cfg, "architectures": [arch]}


@pytest.mark.parametrize(
    "family,change,field",
    [
        ("qwen3", {"num_key_value_heads": 3}, "num_key_value_heads"),
        ("qwen3", {"num_attention_heads": None}, "num_attention_heads"),
        ("qwen3", {"rope_parameters": {"rope_type": "ntk-magic", "rope_theta": 1e4}}, "rope_scaling"),
        ("gemma3", {"sliding_window": None}, "sliding_window"),
        ("gemma3", {"layer_types": ["sliding_attention"]}, "layer_types"),
        ("gemma3", {"layer_types": ["sliding_attention", "global"]}, "layer_types"),
        ("gemma3", {"hidden_activation": "relu"}, "hidden_act"),
        ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4,
                                      "long_factor": [1.0] * 8}}, "short_factor"),
        ("mixtral", {"num_local_experts": None}, "num_experts"),
        ("mixtral", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ("qwen3_moe", {"moe_intermediate_size": None}, "moe_intermediate_size"),
        ("olmoe", {"num_experts_per_tok": 0}, "num_experts_per_tok"),
        ("gpt_oss", {"vocab_size": None}, "vocab_size"),
    ],
)  # fmt: skip
def test_bad_config_names_the_field(family, change, field):
    cfg = {**_config(family), **change}
    with pytest.raises(ValueError, match=field):
        ArchConfig.from_hf_config(cfg)


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="architectures"):
        ArchConfig.from_hf_config({"architectures": ["DeepseekV3ForCausalLM"]})


@pytest.mark.parametrize(
    "drop,field",
    [
        ("qwen3moe.expert_used_count", "expert_used_count"),
        ("qwen3moe.attention.head_count", "head_count"),
        ("qwen3moe.block_count", "block_count"),
    ],
)
def test_bad_gguf_header_names_the_key(drop, field):
    meta = {
        "general.architecture": "qwen3moe",
        "qwen3moe.attention.head_count": 4,
        "qwen3moe.attention.head_count_kv": 2,
        "qwen3moe.embedding_length": 64,
        "qwen3moe.block_count": 2,
        "qwen3moe.vocab_size": 100,
        "qwen3moe.expert_count": 4,
        "qwen3moe.expert_used_count": 2,
        "qwen3moe.expert_feed_forward_length": 32,
    }
    ArchConfig.from_gguf_metadata(meta, True, False)  # complete: loads
    del meta[drop]
    with pytest.raises(ValueError, match=field):
        ArchConfig.from_gguf_metadata(meta, True, False)


def test_unknown_gguf_architecture_is_named():
    with pytest.raises(ValueError, match="general.architecture"):
        ArchConfig.from_gguf_metadata({"general.architecture": "deepseek2"}, True, False)


def test_phi3_su_is_longrope():
    """Phi-3's first 128k checkpoints name LongRoPE "su"."""
    cfg = _config("phi3")
    params = cfg.pop("rope_parameters")
    scaling = {"type": "su", "long_factor": params["long_factor"],
               "short_factor": params["short_factor"]}  # fmt: skip
    arch = ArchConfig.from_hf_config({**cfg, "rope_scaling": scaling, "rope_theta": 1e4})
    assert arch.rope_scaling.rope_type == "longrope"
    assert arch.rope_scaling.long_factor == tuple(params["long_factor"])
