"""RMSNorm of the families in models/, and the small weights they compute with in float32.

In float32 (the CPU methods, or a device method in fp32) every family's norm is one formula.
In a lower dtype on a device each family rounds as transformers does: Llama's style (Qwen3,
Phi-3, Mixtral, OLMoE) rounds the normalized rows to the dtype and scales them by a weight in
the dtype; Gemma 3 and GPT-OSS scale in float32 and round once, so their norm weights stay
float32. A norm weight's dtype says which style applies."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.kernels import ops
from tokenmill.model.linear import FloatMethod
from tokenmill.model.packed import as_float


def fp32_param(method: FloatMethod, weight, offset: float = 0.0) -> torch.Tensor:
    """A small weight used in float32 (sinks, Gemma's norms) on the method's device: the
    checkpoint's values as the method's dtype holds them, plus `offset`, in float32."""
    w = as_float(weight).float()
    if method.dtype != torch.float32:
        w = w.to(method.dtype).float()
    w = w + offset if offset else w
    return w.contiguous().to(method.device)


def norm_weight(
    method: FloatMethod, weight, offset: float = 0.0, fp32_scale: bool = False
) -> torch.Tensor:
    """A norm's weight; Gemma's norms scale by (1 + w): offset 1. `fp32_scale`: the family
    scales in float32 (Gemma 3, GPT-OSS); else the weight is in the method's dtype."""
    if fp32_scale or method.dtype == torch.float32:
        return fp32_param(method, weight, offset)
    return method.param(as_float(weight).float() + offset if offset else weight)


def _low_precision_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32:  # Gemma 3, GPT-OSS: scaled in fp32, rounded once
        return (weight * normed).to(x.dtype)
    return weight * normed.to(x.dtype)


def rms_norm(method: FloatMethod, x: torch.Tensor, weight: torch.Tensor, eps: float):
    """RMSNorm over the last dim (the native kernel on float32 2-D rows)."""
    if x.dtype != torch.float32:
        return _low_precision_norm(x, weight, eps)
    if method.native and x.dim() == 2 and x.shape[1] == weight.shape[0]:
        return ops.rmsnorm(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim of q or k (per head, or over the whole projection)."""
    if x.dtype != torch.float32:
        return _low_precision_norm(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def native_head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """head_norm on float32 [T, heads, head_dim] with the native RMSNorm, a head a row."""
    t, heads, hd = x.shape
    return ops.rmsnorm(x.reshape(t * heads, hd), weight, eps).view(t, heads, hd)
