"""Qwen3-MoE: Qwen3's attention (per-head q/k norms), a sparse MoE feed-forward (softmax,
top-k, renormalised when norm_topk_prob), dense MLP layers where mlp_only_layers says."""

from __future__ import annotations

from tokenmill.model.models.decoder import DecoderModel


class Qwen3MoeForCausalLM(DecoderModel):
    pass
