"""Architecture hyper-parameters of a Llama-family model, read from GGUF metadata or config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Architectures served by the one Llama-family implementation.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
GGUF_ARCHITECTURES = {"llama", "mistral", "qwen2"}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (None type means plain RoPE)."""

    rope_type: str  # "linear" or "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ArchConfig:
    architecture: str  # "llama" | "mistral" | "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2)
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ArchConfig:
        archs = cfg.get("architectures") or []
        arch = next(
            (SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES), None
        )
        if arch is None:
            raise ValueError(
                f"unsupported architecture {archs}; supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        scaling = cfg.get("rope_scaling") or None
        rope_theta = cfg.get("rope_theta")
        # transformers >= 5 folds rope_theta and scaling into `rope_parameters`
        params = cfg.get("rope_parameters") or {}
        if rope_theta is None:
            rope_theta = params.get("rope_theta", 10000.0)
        if scaling is None and params.get("rope_type", "default") != "default":
            scaling = params
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
            rope_scaling=_parse_rope_scaling(scaling),
            sliding_window=cfg.get("sliding_window")
            if cfg.get("use_sliding_window", True)
            else None,
        )

    @classmethod
    def from_gguf_metadata(
        cls, meta: dict[str, Any], has_output_tensor: bool, has_qkv_bias: bool
    ) -> ArchConfig:
        arch = meta["general.architecture"]
        if arch not in GGUF_ARCHITECTURES:
            raise ValueError(
                f"unsupported GGUF architecture {arch!r}; supported: {sorted(GGUF_ARCHITECTURES)}"
            )

        def key(name: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{name}", default)

        heads = key("attention.head_count")
        hidden = key("embedding_length")
        vocab = key("vocab_size") or len(meta["tokenizer.ggml.tokens"])
        scaling = None
        if key("rope.scaling.type") == "linear":
            scaling = {"rope_type": "linear", "factor": key("rope.scaling.factor", 1.0)}
        return cls(
            architecture=arch,
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=key("feed_forward_length"),
            num_hidden_layers=key("block_count"),
            num_attention_heads=heads,
            num_key_value_heads=key("attention.head_count_kv") or heads,
            head_dim=key("attention.key_length") or key("rope.dimension_count") or hidden // heads,
            rms_norm_eps=key("attention.layer_norm_rms_epsilon", 1e-5),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            max_position_embeddings=key("context_length", 2048),
            tie_word_embeddings=not has_output_tensor,
            attention_bias=has_qkv_bias,
            rope_scaling=_parse_rope_scaling(scaling),
            sliding_window=key("attention.sliding_window"),
        )


def _parse_rope_scaling(scaling: dict[str, Any] | None) -> RopeScaling | None:
    if not scaling:
        return None
    rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type in (None, "default"):
        return None
    if rope_type not in ("linear", "llama3"):
        raise ValueError(f"unsupported rope_scaling type {rope_type!r}; supported: linear, llama3")
    return RopeScaling(
        rope_type=rope_type,
        factor=float(scaling.get("factor", 1.0)),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)),
    )
