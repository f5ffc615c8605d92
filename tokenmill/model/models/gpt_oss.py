"""GPT-OSS: attention with biases and a learned sink logit per head, sliding-window layers
alternating with global ones, YaRN RoPE, a biased router whose top-k logits are softmaxed,
and experts with a clamped SwiGLU. The checkpoint's experts are 3-D tensors ([E, in, out],
gate and up interleaved); they are split per expert into the shared naming here."""

from __future__ import annotations

import re

import torch

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.models.decoder import DecoderModel
from tokenmill.model.models.moe import ClampedSwiGLUExpert, Routing, topk_softmax

_EXPERTS = re.compile(r"(model\.layers\.\d+\.mlp\.)experts\.(gate_up_proj|down_proj)(_bias)?")


def _split_experts(prefix: str, kind: str, bias: bool, w: torch.Tensor, out: dict) -> None:
    for e in range(w.shape[0]):
        p = f"{prefix}experts.{e}."
        if kind == "down_proj":
            out[p + ("down_proj.bias" if bias else "down_proj.weight")] = (
                w[e] if bias else w[e].t().contiguous()
            )
            continue
        gate, up = w[e][..., ::2], w[e][..., 1::2]
        if bias:
            out[p + "gate_proj.bias"], out[p + "up_proj.bias"] = gate, up
        else:
            out[p + "gate_proj.weight"] = gate.t().contiguous()
            out[p + "up_proj.weight"] = up.t().contiguous()


class GptOssForCausalLM(DecoderModel):
    def normalize_weights(self, weights: dict) -> dict:
        out = {}
        for name, w in weights.items():
            m = _EXPERTS.fullmatch(name)
            if m:
                _split_experts(m.group(1), m.group(2), m.group(3) is not None, w, out)
            else:
                out[name.replace(".mlp.router.", ".mlp.gate.")] = w
        return out

    def routing_for(self, cfg: ArchConfig) -> Routing:
        return topk_softmax

    def expert_factory(self):
        cfg, method = self.config, self.method
        return lambda weights, prefix: ClampedSwiGLUExpert(weights, prefix, method, cfg)
