"""Phi-3 / Phi-4: fused qkv_proj and gate_up_proj weights (taken as stored), LongRoPE and
partial rotary from the config."""

from __future__ import annotations

from tokenmill.model.models.decoder import DecoderModel


class Phi3ForCausalLM(DecoderModel):
    pass
