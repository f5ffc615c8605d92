"""Gemma 3 (text): sliding-window layers interleaved with global ones (each kind its own RoPE
base), norms scaling by (1 + w) before and after both blocks, embeddings scaled by
sqrt(hidden_size), GeGLU, softmax scale 1/sqrt(query_pre_attn_scalar), optional final logit
soft-capping. GGUF files store the norms as (1 + w) already: the loader takes the 1 off."""

from __future__ import annotations

from tokenmill.model.models.decoder import DecoderModel


class Gemma3ForCausalLM(DecoderModel):
    norm_offset = 1.0
    sandwich_norms = True
    scale_embeddings = True
