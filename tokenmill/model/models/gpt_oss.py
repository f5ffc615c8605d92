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
# MXFP4's 4-bit values (e2m1), low nibble first; each block of 32 shares a power-of-two scale
_FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The published checkpoints' experts: blocks [E, rows, groups, 16] uint8 and scales
    [E, rows, groups] (exponent + 127) -> float32 [E, cols, rows] (the layout the bf16
    checkpoints store: x @ W)."""
    lut = torch.tensor(_FP4, dtype=torch.float32)
    b = blocks.to(torch.uint8)
    values = torch.stack((lut[(b & 0x0F).long()], lut[(b >> 4).long()]), dim=-1).flatten(-2)
    values = torch.ldexp(values, (scales.to(torch.int32) - 127).unsqueeze(-1))
    return values.flatten(-2).transpose(1, 2).contiguous()


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
    fp32_norms = True  # its RMSNorm scales in float32, then rounds

    def normalize_weights(self, weights: dict) -> dict:
        for name in [n for n in weights if n.endswith("_blocks")]:
            base = name[: -len("_blocks")]
            scales = weights.pop(base + "_scales", None)
            if scales is None:
                raise ValueError(f"{base}_scales is missing for {name}")
            weights[base] = dequantize_mxfp4(weights.pop(name), scales)
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
