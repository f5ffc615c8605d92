"""Gemma 3 (text): sliding-window layers interleaved with global ones (each kind its own RoPE
base), norms scaling by (1 + w) before and after both blocks, embeddings scaled by
sqrt(hidden_size), GeGLU, softmax scale 1/sqrt(query_pre_attn_scalar), optional final logit
soft-capping. GGUF files store the norms as (1 + w) already: the loader takes the 1 off.
The multimodal checkpoints (Gemma3ForConditionalGeneration) serve their language model."""

from __future__ import annotations

from tokenmill.model.models.decoder import DecoderModel

# the multimodal checkpoints' language model (older and newer transformers' names)
_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
           "model.multi_modal_projector.")  # fmt: skip


class Gemma3ForCausalLM(DecoderModel):
    norm_offset = 1.0
    fp32_norms = True
    sandwich_norms = True
    scale_embeddings = True

    def normalize_weights(self, weights: dict) -> dict:
        """Gemma3ForConditionalGeneration's text model; its vision tower is not served."""
        out = {}
        for name, w in weights.items():
            if name.startswith(_VISION):
                continue
            for old, new in _PREFIXES:
                if name.startswith(old):
                    name = new + name[len(old) :]
                    break
            out[name] = w
        return out
