"""How linear layers run on a torch device (CUDA): weights and activations in the model's
dtype (bf16, or fp32 for parity checks) on the device, F.linear; or FP8 W8A8 (`--weights
fp8`): weights in float8_e4m3fn with one scale per output channel, activations quantized per
token at run time, torch's scaled matrix multiply (Hopper), bf16 out.

Norms compute in fp32 and round to the dtype as transformers does; the residual stream stays
in the dtype. On CPU tensors the same code runs (the tests' reference for the GPU path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.model.packed import PackedWeight, as_float

FP8 = torch.float8_e4m3fn
_FP8_MAX = torch.finfo(FP8).max


def _on(weight, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(weight, PackedWeight):  # GGUF blocks: dequantized at load
        weight = as_float(weight)
    return weight.to(device=device, dtype=dtype).contiguous()


class DeviceLinear:
    def __init__(self, weight, bias, device: torch.device, dtype: torch.dtype) -> None:
        self.weight = _on(weight, device, dtype)  # [out, in]
        self.bias = None if bias is None else _on(bias, device, dtype)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        return y if residual is None else residual.add_(y)


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (per output channel / per token) FP8 with an fp32 scale: x ≈ q * scale."""
    amax = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    scale = amax / _FP8_MAX
    q = (x.float() / scale).clamp(-_FP8_MAX, _FP8_MAX).to(FP8)
    return q, scale


class Fp8Linear:
    """W8A8 FP8: y = (q_x · q_w^T) * s_x * s_w^T, in one scaled matmul."""

    def __init__(self, weight, bias, device: torch.device, dtype: torch.dtype) -> None:
        w = _on(weight, device, torch.float32)
        out_features, in_features = w.shape
        if in_features % 16 or out_features % 16:
            raise ValueError(
                f"weights: fp8 needs dimensions divisible by 16, got [{out_features}, "
                f"{in_features}]"
            )
        q, scale = quantize_fp8_rows(w)
        self.weight_t = q.t()  # column-major [in, out], as the scaled matmul wants it
        self.scale_t = scale.t().contiguous()  # [1, out]
        self.bias = None if bias is None else _on(bias, device, dtype)
        self.dtype = dtype

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        q, scale = quantize_fp8_rows(x)
        y = torch._scaled_mm(
            q, self.weight_t, scale_a=scale, scale_b=self.scale_t, out_dtype=self.dtype
        )
        if self.bias is not None:  # added apart: row-wise scaling takes no bias on every build
            y += self.bias
        return y if residual is None else residual.add_(y)


class DeviceMethod:
    """Weights on `device` in `dtype` ("bfloat16" / "float32" schemes on CUDA), or FP8
    (the output layer stays in `dtype`, as FP8 checkpoints keep it). The interface of
    linear.FloatMethod, in torch ops only."""

    fused_decode = False
    prefetch = None
    native = False

    def __init__(self, device: str, dtype: torch.dtype, fp8: bool = False) -> None:
        self.device = torch.device(device)
        self.dtype = dtype
        self.fp8 = fp8
        self.name = "fp8" if fp8 else str(dtype).removeprefix("torch.")

    def linear(self, weight, bias: torch.Tensor | None = None):
        if self.fp8:
            return Fp8Linear(weight, bias, self.device, self.dtype)
        return DeviceLinear(weight, bias, self.device, self.dtype)

    def lm_head(self, weight) -> DeviceLinear:
        return DeviceLinear(weight, None, self.device, self.dtype)

    def param(self, weight) -> torch.Tensor:
        return _on(weight, self.device, self.dtype)

    def table(self, weight) -> torch.Tensor:
        return _on(weight, self.device, self.dtype)

    def norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * x32.to(x.dtype)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


# --weights on CUDA: the GPU's formats (the file's own format, "native", is bf16 there)
_CUDA_SCHEMES = {"native": torch.bfloat16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def device_method(scheme: str, device: str) -> DeviceMethod:
    """The method for --weights `scheme` on `device` ("fp8" also runs on the CPU: the KLD
    gate and the tests measure it there)."""
    if scheme == "fp8":
        return DeviceMethod(device, torch.bfloat16 if device != "cpu" else torch.float32, True)
    if device != "cpu" and scheme in _CUDA_SCHEMES:
        return DeviceMethod(device, _CUDA_SCHEMES[scheme])
    raise ValueError(
        f"weights: {scheme!r} runs on the CPU only; on {device}: bfloat16 (the default), "
        "float32 or fp8"
    )
