"""OLMoE: q/k RMSNorm over the whole projection (not per head), optional q/k/v clipping,
64 experts with softmax top-8, not renormalised by default."""

from __future__ import annotations

from tokenmill.model.models.decoder import DecoderModel


class OlmoeForCausalLM(DecoderModel):
    pass
