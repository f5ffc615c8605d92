"""Each served family's config.json fields and GGUF metadata keys, as ArchConfig keyword
arguments (rope scaling still a dict: arch_config parses it). Torch-free: front ends read
configs without the weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# config.json "architectures" entry -> family
HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3",  # served as text: its language model
    "Phi3ForCausalLM": "phi3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "OlmoeForCausalLM": "olmoe",
    "GptOssForCausalLM": "gpt_oss",
}
# llama.cpp's general.architecture -> family ("llama" with experts is Mixtral)
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "mistral": "mistral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "qwen3moe": "qwen3_moe",
    "olmoe": "olmoe",
    "gpt-oss": "gpt_oss",
}
# Gemma 3 checkpoints without layer_types: every sixth layer is global
GEMMA3_SLIDING_PATTERN = 6
# Gemma3TextConfig's defaults: the multimodal checkpoints' text_config leaves them out
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "max_position_embeddings": 131072,
    "hidden_activation": "gelu_pytorch_tanh",
}


def need(cfg: dict[str, Any], name: str, where: str = "config.json") -> Any:
    value = cfg.get(name)
    if value is None:
        raise ValueError(f"{where}: {name} is missing")
    return value


# ---------------------------------------------------------------- config.json


def _rope(cfg: dict[str, Any], params: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict) from the old keys or transformers 5's rope_parameters."""
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = dict(params)
    if scaling is not None and scaling.get("original_max_position_embeddings") is None:
        original = cfg.get("original_max_position_embeddings")
        if original is not None:
            scaling = {**scaling, "original_max_position_embeddings": original}
    return float(theta), scaling


def hf_fields(arch: str, cfg: dict[str, Any]) -> dict[str, Any]:
    if arch == "gemma3":
        text = cfg.get("text_config") or {}
        tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
        cfg = {**GEMMA3_TEXT_DEFAULTS, **(text or cfg), "tie_word_embeddings": tie}
    heads = need(cfg, "num_attention_heads")
    hidden = need(cfg, "hidden_size")
    params = cfg.get("rope_parameters") or {}
    if arch == "gemma3" and "full_attention" in params:
        params = params["full_attention"] or {}
    theta, scaling = _rope(cfg, params)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    fields: dict[str, Any] = dict(
        architecture=arch,
        vocab_size=need(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=cfg.get("intermediate_size") or 0,
        num_hidden_layers=need(cfg, "num_hidden_layers"),
        num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        rope_scaling=scaling,
        sliding_window=window,
        partial_rotary_factor=float(
            cfg.get("partial_rotary_factor") or params.get("partial_rotary_factor") or 1.0
        ),
    )
    if cfg.get("layer_types") and window:
        fields["layer_types"] = tuple(cfg["layer_types"])
    fields.update(_HF_FAMILY.get(arch, lambda c: {})(cfg))
    if not fields["intermediate_size"] and not fields.get("num_experts"):
        raise ValueError("config.json: intermediate_size is missing")
    return fields


def _hf_qwen3(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"qk_norm": "head"}


def _hf_gemma3(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping: not supported (Gemma 3 does not use it)")
    layers = need(cfg, "num_hidden_layers")
    types = cfg.get("layer_types")
    if not types:
        pattern = cfg.get("sliding_window_pattern") or GEMMA3_SLIDING_PATTERN
        types = [_gemma_type(i, pattern) for i in range(layers)]
    params = cfg.get("rope_parameters") or {}
    local = (params.get("sliding_attention") or {}).get("rope_theta")
    return dict(
        qk_norm="head",
        hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
        query_pre_attn_scalar=float(need(cfg, "query_pre_attn_scalar")),
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        rope_local_theta=float(local or cfg.get("rope_local_base_freq") or 10000.0),
        layer_types=tuple(types),
        sliding_window=need(cfg, "sliding_window"),
    )


def _gemma_type(layer: int, pattern: int) -> str:
    return "full_attention" if (layer + 1) % pattern == 0 else "sliding_attention"


def _hf_experts(cfg: dict[str, Any], width_key: str) -> dict[str, Any]:
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts is None:
        raise ValueError("config.json: num_experts (num_local_experts) is missing")
    return dict(
        num_experts=int(experts),
        num_experts_per_tok=int(need(cfg, "num_experts_per_tok")),
        moe_intermediate_size=int(need(cfg, width_key)),
    )


def _hf_mixtral(cfg: dict[str, Any]) -> dict[str, Any]:
    return {**_hf_experts(cfg, "intermediate_size"), "norm_topk_prob": True}


def _hf_qwen3_moe(cfg: dict[str, Any]) -> dict[str, Any]:
    layers = need(cfg, "num_hidden_layers")
    step = cfg.get("decoder_sparse_step", 1) or 1
    only = set(cfg.get("mlp_only_layers") or [])
    dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    return dict(
        **_hf_experts(cfg, "moe_intermediate_size"),
        qk_norm="head",
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        dense_layers=dense,
    )


def _hf_olmoe(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **_hf_experts(cfg, "intermediate_size"),
        qk_norm="proj",
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
        clip_qkv=cfg.get("clip_qkv"),
    )


def _hf_gpt_oss(cfg: dict[str, Any]) -> dict[str, Any]:
    return dict(
        **_hf_experts(cfg, "intermediate_size"),
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
    )


_HF_FAMILY: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "qwen3": _hf_qwen3,
    "gemma3": _hf_gemma3,
    "mixtral": _hf_mixtral,
    "qwen3_moe": _hf_qwen3_moe,
    "olmoe": _hf_olmoe,
    "gpt_oss": _hf_gpt_oss,
}


# ---------------------------------------------------------------- GGUF


def gguf_fields(gguf_arch: str, meta: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """ArchConfig keywords from a GGUF header (`tensors`: name -> array of the few tensors
    that carry configuration; names of the others map to None)."""

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{gguf_arch}.{name}", default)

    def req(name: str) -> Any:
        return need(meta, f"{gguf_arch}.{name}", "GGUF metadata")

    arch = GGUF_ARCHITECTURES[gguf_arch]
    experts = int(key("expert_count") or 0)
    if arch == "llama" and experts:
        arch = "mixtral"
    heads = req("attention.head_count")
    hidden = req("embedding_length")
    head_dim = key("attention.key_length") or hidden // heads
    vocab = key("vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    scaling = None
    scaling_type = key("rope.scaling.type")
    if scaling_type == "linear":
        scaling = {"rope_type": "linear", "factor": key("rope.scaling.factor", 1.0)}
    elif scaling_type not in (None, "none"):
        scaling = {"rope_type": scaling_type}
    fields: dict[str, Any] = dict(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length") or 0,
        num_hidden_layers=req("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=key("attention.head_count_kv") or heads,
        head_dim=head_dim,
        rms_norm_eps=key("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        max_position_embeddings=key("context_length", 2048),
        rope_scaling=scaling,
        sliding_window=key("attention.sliding_window"),
        partial_rotary_factor=(key("rope.dimension_count") or head_dim) / head_dim,
    )
    if "blk.0.attn_q_norm.weight" in tensors:
        fields["qk_norm"] = "proj" if arch == "olmoe" else "head"
    if experts:
        fields.update(
            num_experts=experts,
            num_experts_per_tok=int(req("expert_used_count")),
            moe_intermediate_size=int(
                key("expert_feed_forward_length") or key("feed_forward_length") or 0
            ),
            norm_topk_prob=bool(key("expert_weights_norm", arch in ("mixtral", "qwen3_moe"))),
        )
        if tensors:  # layers without a router run a dense MLP (Qwen3-MoE's mlp_only_layers)
            fields["dense_layers"] = tuple(
                i
                for i in range(fields["num_hidden_layers"])
                if f"blk.{i}.ffn_gate_inp.weight" not in tensors
            )
    family = _GGUF_FAMILY.get(arch)
    if family is not None:
        family(fields, key, tensors)
    return fields


def _gguf_gemma3(fields: dict[str, Any], key: Callable, tensors: dict[str, Any]) -> None:
    pattern = key("attention.sliding_window_pattern") or GEMMA3_SLIDING_PATTERN
    layers = fields["num_hidden_layers"]
    if isinstance(pattern, list):  # newer files: one flag per layer (true = sliding)
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = [_gemma_type(i, int(pattern)) for i in range(layers)]
    fields.update(
        hidden_act="gelu_pytorch_tanh",
        query_pre_attn_scalar=float(fields["head_dim"]),  # what llama.cpp uses
        final_logit_softcapping=key("final_logit_softcapping"),
        rope_local_theta=float(key("rope.freq_base_swa", 10000.0)),
        layer_types=tuple(types),
    )
    if not fields["sliding_window"]:
        raise ValueError("GGUF metadata: gemma3.attention.sliding_window is missing")


def _gguf_phi3(fields: dict[str, Any], key: Callable, tensors: dict[str, Any]) -> None:
    long = tensors.get("rope_factors_long.weight")
    short = tensors.get("rope_factors_short.weight")
    if long is None and short is None:
        return
    if long is None or short is None:
        raise ValueError("GGUF: LongRoPE needs both rope_factors_long and rope_factors_short")
    original = key("rope.scaling.original_context_length")
    if original is None:
        raise ValueError("GGUF metadata: phi3.rope.scaling.original_context_length is missing")
    fields["rope_scaling"] = {
        "rope_type": "longrope",
        "long_factor": [float(v) for v in long],
        "short_factor": [float(v) for v in short],
        "original_max_position_embeddings": int(original),
        "attention_factor": key("rope.scaling.attn_factor"),
    }


def _gguf_gpt_oss(fields: dict[str, Any], key: Callable, tensors: dict[str, Any]) -> None:
    window = fields["sliding_window"]
    layers = fields["num_hidden_layers"]
    if not window:
        raise ValueError("GGUF metadata: gpt-oss.attention.sliding_window is missing")
    # llama.cpp: even layers slide, odd layers attend to everything
    fields["layer_types"] = tuple(
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
    )
    limit = key("swiglu_clamp_exp")  # a value per layer in newer files
    if isinstance(limit, list):
        limit = next((v for v in limit if v), None)
    fields["swiglu_limit"] = float(limit or 7.0)
    if key("rope.scaling.type") == "yarn":
        fields["rope_scaling"] = {
            "rope_type": "yarn",
            "factor": key("rope.scaling.factor"),
            "original_max_position_embeddings": key("rope.scaling.original_context_length"),
            "beta_fast": key("rope.scaling.yarn_beta_fast"),
            "beta_slow": key("rope.scaling.yarn_beta_slow"),
            "truncate": False,
        }


_GGUF_FAMILY: dict[str, Callable[[dict[str, Any], Callable, dict[str, Any]], None]] = {
    "gemma3": _gguf_gemma3,
    "phi3": _gguf_phi3,
    "gpt_oss": _gguf_gpt_oss,
}
