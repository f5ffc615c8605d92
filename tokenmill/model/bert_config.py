"""BERT-family encoders (`BertModel` checkpoints, as sentence-transformers saves them): their
config.json read without torch, for the front end and the engine alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenmill.model.arch_config import ArchConfig

ENCODER_ARCHITECTURES = ("BertModel", "BertForMaskedLM", "BertForPreTraining")


def is_encoder_config(cfg: dict[str, Any]) -> bool:
    archs = cfg.get("architectures") or []
    return cfg.get("model_type") == "bert" or any(a in ENCODER_ARCHITECTURES for a in archs)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> BertConfig:
        try:
            out = cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=int(cfg["hidden_size"]),
                num_hidden_layers=int(cfg["num_hidden_layers"]),
                num_attention_heads=int(cfg["num_attention_heads"]),
                intermediate_size=int(cfg["intermediate_size"]),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
                type_vocab_size=int(cfg.get("type_vocab_size", 2)),
                layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
                hidden_act=str(cfg.get("hidden_act", "gelu")),
            )
        except KeyError as e:
            raise ValueError(f"config.json: {e.args[0]} is missing (a BERT encoder)") from None
        if out.hidden_act not in ("gelu", "gelu_new", "relu"):
            raise ValueError(f"hidden_act: unsupported {out.hidden_act!r} for a BERT encoder")
        if out.position_embedding_type(cfg) != "absolute":
            raise ValueError("position_embedding_type: only 'absolute' is supported")
        if out.hidden_size % out.num_attention_heads:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        return out

    @staticmethod
    def position_embedding_type(cfg: dict[str, Any]) -> str:
        return str(cfg.get("position_embedding_type", "absolute"))

    def arch(self) -> ArchConfig:
        """The engine's view: shapes for the KV pool and the front end's limits (an encoder
        keeps no KV; its pool stays untouched)."""
        head_dim = self.hidden_size // self.num_attention_heads
        return ArchConfig(
            architecture="bert",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,  # the engine's KV pool: one token-sized layer is enough
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=head_dim,
            rms_norm_eps=self.layer_norm_eps,
            rope_theta=10000.0,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=False,
            attention_bias=True,
        )


def encoder_arch(cfg: dict[str, Any]) -> ArchConfig | None:
    """The engine's view of an encoder's config.json; None for any other model."""
    return BertConfig.from_hf_config(cfg).arch() if is_encoder_config(cfg) else None
