"""Qwen3 (dense): Llama's layout plus an RMSNorm per head on q and k before RoPE."""

from __future__ import annotations

from tokenmill.model.models.decoder import DecoderModel


class Qwen3ForCausalLM(DecoderModel):
    pass  # q/k norms come from the config (qk_norm="head")
