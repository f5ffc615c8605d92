"""Building blocks of the decoder families in models/: RMSNorm, self-attention (fused or
separate q/k/v, biases, q/k norms, partial rotary, per-layer window, scale and sinks) and the
gated MLP. Weights arrive in Hugging Face naming and become layers through the linear
method (method.linear), which places and packs them; activations are float32 on the CPU,
the device method's dtype on a device."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tokenmill.kernels import ops
from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.attention import AttentionBackend, AttentionMetadata
from tokenmill.model.linear import FloatMethod
from tokenmill.model.models.norms import fp32_param, head_norm, native_head_norm, norm_weight
from tokenmill.model.packed import as_float, cat_rows
from tokenmill.model.rotary import RotaryEmbedding

Take = Callable[[str], torch.Tensor]  # pops one weight by its name under a prefix


def optional(weights: dict, name: str):
    return weights.pop(name, None)


class SelfAttention:
    def __init__(
        self,
        cfg: ArchConfig,
        weights: dict,
        prefix: str,
        method: FloatMethod,
        layer: int,
        rope: RotaryEmbedding,
        norm_offset: float = 0.0,
        fp32_norms: bool = False,
    ) -> None:
        fused = weights.pop(prefix + "qkv_proj.weight", None)
        if fused is None:
            fused = cat_rows([weights.pop(prefix + f"{p}_proj.weight") for p in "qkv"])
        bias = optional(weights, prefix + "qkv_proj.bias")
        if bias is None and prefix + "q_proj.bias" in weights:
            bias = torch.cat([as_float(weights.pop(prefix + f"{p}_proj.bias")) for p in "qkv"])
        self.method = method
        self.qkv_proj = method.linear(fused, bias)
        self.o_proj = method.linear(
            weights.pop(prefix + "o_proj.weight"), optional(weights, prefix + "o_proj.bias")
        )
        self.q_norm = self.k_norm = None
        if cfg.qk_norm is not None:
            for name in ("q_norm", "k_norm"):
                w = weights.pop(f"{prefix}{name}.weight")
                setattr(self, name, norm_weight(method, w, norm_offset, fp32_norms))
        sinks = optional(weights, prefix + "sinks")
        self.sinks = None if sinks is None else fp32_param(method, sinks)
        self.qk_norm, self.eps, self.clip = cfg.qk_norm, cfg.rms_norm_eps, cfg.clip_qkv
        self.rope = rope
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.q_size, self.kv_size = cfg.head_dim, cfg.q_size, cfg.kv_size
        self.window = cfg.layer_window(layer)
        scalar = cfg.query_pre_attn_scalar
        self.scale = (scalar if scalar is not None else cfg.head_dim) ** -0.5

    def forward(
        self,
        x: torch.Tensor,  # normalized hidden states [T, hidden]
        positions: torch.Tensor,
        attn: AttentionBackend,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        m, t, hd = self.method, x.shape[0], self.head_dim
        qkv = self.qkv_proj(m.activation(x))
        if self.clip is not None:
            qkv = qkv.clamp(-self.clip, self.clip)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=1)
        if self.qk_norm == "proj":  # OLMoE: one norm over all heads
            q, k = head_norm(q, self.q_norm, self.eps), head_norm(k, self.k_norm, self.eps)
        q, k = q.reshape(t, self.num_heads, hd), k.reshape(t, self.num_kv_heads, hd)
        # the native method runs the one-call decoder's RoPE (full or partial) and head norms,
        # so the two paths give the same bits
        native = m.native and q.dtype == torch.float32
        if self.qk_norm == "head":
            norm = native_head_norm if native else head_norm
            q, k = norm(q, self.q_norm, self.eps), norm(k, self.k_norm, self.eps)
        if native:
            q, k = q.contiguous(), k.contiguous()
            for x, heads in ((q, self.num_heads), (k, self.num_kv_heads)):
                ops.rope_neox_(x.view(t, heads * hd), heads, hd, positions, self.rope.cos,
                               self.rope.sin)  # fmt: skip
        else:
            q, k = self.rope.apply(positions, q), self.rope.apply(positions, k)
        v = v.reshape(t, self.num_kv_heads, hd)
        layer_attn = attn.for_layer(self.window, self.scale, self.sinks)
        out = layer_attn.forward(q.contiguous(), k.contiguous(), v, kv_cache, meta)
        return self.o_proj(m.activation(out), residual=residual)


def gated_activation(method: FloatMethod, gate_up: torch.Tensor, act: str):
    """act(gate) * up on [T, 2I] (gate first), ready for the down projection."""
    if act == "silu":
        return method.silu_mul(gate_up)
    if method.native and gate_up.dtype == torch.float32 and not gate_up.requires_grad:
        return method.activation(ops.gelu_tanh_mul(gate_up))  # the one-call decoder's GELU
    half = gate_up.shape[1] // 2
    return method.activation(F.gelu(gate_up[:, :half], approximate="tanh") * gate_up[:, half:])


class GatedMLP:
    """down(act(gate(x)) * up(x)); gate and up fused into one projection."""

    def __init__(self, weights: dict, prefix: str, method: FloatMethod, act: str) -> None:
        fused = weights.pop(prefix + "gate_up_proj.weight", None)
        if fused is None:
            fused = cat_rows(
                [weights.pop(prefix + "gate_proj.weight"), weights.pop(prefix + "up_proj.weight")]
            )
        self.method, self.act = method, act
        self.gate_up_proj = method.linear(fused)
        self.down_proj = method.linear(weights.pop(prefix + "down_proj.weight"))

    def activate(self, gate_up: torch.Tensor) -> torch.Tensor:
        return gated_activation(self.method, gate_up, self.act)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        gate_up = self.gate_up_proj(self.method.activation(x))
        return self.down_proj(self.activate(gate_up), residual=residual)
