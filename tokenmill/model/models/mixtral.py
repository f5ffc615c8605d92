"""Mixtral: Mistral's attention, a sparse MoE feed-forward (softmax, top-2, renormalised)."""

from __future__ import annotations

import re

from tokenmill.model.models.decoder import DecoderModel

_EXPERT = re.compile(r"(model\.layers\.\d+\.)block_sparse_moe\.(.*)")
_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class MixtralForCausalLM(DecoderModel):
    def normalize_weights(self, weights: dict) -> dict:
        """block_sparse_moe.experts.{e}.w1/w3/w2 -> mlp.experts.{e}.gate/up/down_proj."""
        out = {}
        for name, w in weights.items():
            m = _EXPERT.fullmatch(name)
            if m:
                rest = m.group(2)
                for old, new in _PROJ.items():
                    rest = rest.replace(f".{old}.", f".{new}.")
                name = f"{m.group(1)}mlp.{rest}"
            out[name] = w
        return out
