"""Architecture hyper-parameters of a served model, read from GGUF metadata or config.json.

One frozen ArchConfig describes every family (model/models/ builds the layers): the Llama
fields, plus what Qwen3, Gemma 3, Phi-3 and the mixture-of-experts families add. Each
family's config.json / GGUF keys are read in arch_families.py; a missing or inconsistent
field is a ValueError naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmill.model.arch_families import (
    GGUF_ARCHITECTURES,
    HF_ARCHITECTURES,
    gguf_fields,
    hf_fields,
)

# kept for callers that list what is served
SUPPORTED_ARCHITECTURES = HF_ARCHITECTURES
ROPE_TYPES = ("linear", "llama3", "longrope", "yarn")
LAYER_TYPES = ("full_attention", "sliding_attention")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (None type means plain RoPE)."""

    rope_type: str  # "linear" | "llama3" | "longrope" (Phi-3) | "yarn" (GPT-OSS)
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    long_factor: tuple[float, ...] | None = None  # longrope: per-frequency divisors
    short_factor: tuple[float, ...] | None = None
    attention_factor: float | None = None  # longrope / yarn: cos and sin scaled by it
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0
    truncate: bool = True


@dataclass(frozen=True)
class ArchConfig:
    architecture: str  # a value of HF_ARCHITECTURES: "llama", "qwen3", "gemma3", "mixtral", ...
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
    attention_bias: bool  # q/k/v projections carry a bias (Qwen2, GPT-OSS)
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None
    # per layer "full_attention" | "sliding_attention" (Gemma 3, GPT-OSS); None: every layer
    # attends through sliding_window (None = full)
    layer_types: tuple[str, ...] | None = None
    qk_norm: str | None = None  # "head": RMSNorm per head (Qwen3, Gemma 3); "proj": OLMoE's
    hidden_act: str = "silu"  # of the gated MLP: "silu" | "gelu_pytorch_tanh" (GeGLU)
    partial_rotary_factor: float = 1.0  # rotated share of each head (Phi-4-mini: 0.75)
    query_pre_attn_scalar: float | None = None  # softmax scale 1/sqrt(it) (Gemma 3)
    final_logit_softcapping: float | None = None
    rope_local_theta: float | None = None  # RoPE base of sliding layers (Gemma 3)
    clip_qkv: float | None = None  # OLMoE
    # mixture of experts (0 experts: dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the top-k routing weights
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP in a MoE model (Qwen3-MoE)
    swiglu_limit: float | None = None  # GPT-OSS's clamped SwiGLU
    swiglu_alpha: float = 1.702

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "head_dim"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_attention_heads <= 0 or self.num_key_value_heads <= 0:
            raise ValueError("num_attention_heads and num_key_value_heads must be positive")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"hidden_act: unsupported {self.hidden_act!r}; supported: {ACTIVATIONS}"
            )
        if self.layer_types is not None:
            if len(self.layer_types) != self.num_hidden_layers:
                raise ValueError(
                    f"layer_types has {len(self.layer_types)} entries for "
                    f"num_hidden_layers {self.num_hidden_layers}"
                )
            unknown = set(self.layer_types) - set(LAYER_TYPES)
            if unknown:
                raise ValueError(f"layer_types: unknown {sorted(unknown)}; known: {LAYER_TYPES}")
            if "sliding_attention" in self.layer_types and not self.sliding_window:
                raise ValueError("sliding_window is missing for the sliding_attention layers")
        if self.rotary_dim % 2 or not 0 < self.partial_rotary_factor <= 1:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives an odd "
                             f"or empty rotary part of head_dim {self.head_dim}")  # fmt: skip
        self._check_experts()

    def _check_experts(self) -> None:
        if self.num_experts < 0:
            raise ValueError(f"num_experts must not be negative, got {self.num_experts}")
        if not self.num_experts:
            return
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(
                f"num_experts_per_tok ({self.num_experts_per_tok}) must be in 1..num_experts "
                f"({self.num_experts})"
            )
        if self.moe_intermediate_size <= 0:
            raise ValueError("moe_intermediate_size (the experts' width) is missing")

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of one layer (None: full attention)."""
        if self.layer_types is None:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    @property
    def kv_sliding_window(self) -> int | None:
        """The window every layer attends through (blocks out of it can be freed); None
        when some layer attends to the whole sequence."""
        if self.layer_types is not None and "full_attention" in self.layer_types:
            return None
        return self.sliding_window

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ArchConfig:
        archs = cfg.get("architectures") or []
        arch = next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"architectures: unsupported {archs}; supported: {sorted(HF_ARCHITECTURES)}"
            )
        fields = hf_fields(arch, cfg)
        fields["rope_scaling"] = _parse_rope_scaling(
            fields.get("rope_scaling"), fields["max_position_embeddings"]
        )
        return cls(**fields)

    @classmethod
    def from_gguf_metadata(
        cls,
        meta: dict[str, Any],
        has_output_tensor: bool,
        has_qkv_bias: bool,
        tensors: dict[str, Any] | None = None,
    ) -> ArchConfig:
        """`tensors`: the file's small tensors that carry configuration (Phi-3's LongRoPE
        factors, q/k norms' presence), name -> array."""
        arch = meta.get("general.architecture")
        if arch not in GGUF_ARCHITECTURES:
            raise ValueError(
                f"general.architecture: unsupported GGUF architecture {arch!r}; "
                f"supported: {sorted(GGUF_ARCHITECTURES)}"
            )
        fields = gguf_fields(arch, meta, tensors or {})
        fields["tie_word_embeddings"] = not has_output_tensor
        fields["attention_bias"] = has_qkv_bias
        fields["rope_scaling"] = _parse_rope_scaling(
            fields.get("rope_scaling"), fields["max_position_embeddings"]
        )
        return cls(**fields)


def _parse_rope_scaling(scaling: dict[str, Any] | None, max_positions: int) -> RopeScaling | None:
    if not scaling:
        return None
    rope_type = scaling.get("rope_type") or scaling.get("type")
    if rope_type in (None, "default"):
        return None
    rope_type = {"su": "longrope"}.get(rope_type, rope_type)  # Phi-3's first name for it
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"rope_scaling: unsupported type {rope_type!r}; supported: {', '.join(ROPE_TYPES)}"
        )
    original = scaling.get("original_max_position_embeddings")
    factor = scaling.get("factor")
    if rope_type in ("longrope", "yarn"):
        if original is None:
            raise ValueError(f"rope_scaling: {rope_type} needs original_max_position_embeddings")
        if factor is None:
            factor = max_positions / original
    if rope_type == "longrope":
        for key in ("long_factor", "short_factor"):
            if not scaling.get(key):
                raise ValueError(f"rope_scaling: longrope needs {key}")
    attention_factor = scaling.get("attention_factor")
    return RopeScaling(
        rope_type=rope_type,
        factor=float(1.0 if factor is None else factor),
        low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
        high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(original or 8192),
        long_factor=_floats(scaling.get("long_factor")),
        short_factor=_floats(scaling.get("short_factor")),
        attention_factor=None if attention_factor is None else float(attention_factor),
        beta_fast=float(scaling.get("beta_fast") or 32.0),
        beta_slow=float(scaling.get("beta_slow") or 1.0),
        truncate=bool(scaling.get("truncate", True)),
    )


def _floats(values) -> tuple[float, ...] | None:
    return None if values is None else tuple(float(v) for v in values)
