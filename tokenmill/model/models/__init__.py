"""Model registry: each family's class by ArchConfig.architecture. Llama, Mistral and Qwen2
run model/llama.py (its fused native decode path); the others a DecoderModel subclass."""

from __future__ import annotations

import torch

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.linear import FloatMethod
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.model.models.decoder import DecoderModel
from tokenmill.model.models.gemma3 import Gemma3ForCausalLM
from tokenmill.model.models.gpt_oss import GptOssForCausalLM
from tokenmill.model.models.mixtral import MixtralForCausalLM
from tokenmill.model.models.olmoe import OlmoeForCausalLM
from tokenmill.model.models.phi3 import Phi3ForCausalLM
from tokenmill.model.models.qwen3 import Qwen3ForCausalLM
from tokenmill.model.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3": Gemma3ForCausalLM,
    "phi3": Phi3ForCausalLM,
    "mixtral": MixtralForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "olmoe": OlmoeForCausalLM,
    "gpt_oss": GptOssForCausalLM,
}


def build_model(
    cfg: ArchConfig,
    weights: dict,
    max_positions: int,
    method: FloatMethod | None = None,
    rope_freq_factors: torch.Tensor | None = None,
) -> LlamaForCausalLM | DecoderModel:
    """The runnable model of cfg's family on these weights (Hugging Face naming)."""
    cls = MODEL_REGISTRY.get(cfg.architecture)
    if cls is None:
        raise ValueError(f"architecture: no model for {cfg.architecture!r}")
    return cls(cfg, weights, max_positions, method, rope_freq_factors)
