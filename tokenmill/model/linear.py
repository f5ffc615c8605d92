"""Linear layers and how their weights are stored (the "linear method")."""

from __future__ import annotations

import torch


class Linear:
    """y = x @ W^T (+ b), with W kept transposed ([in, out], contiguous): on CPU this beats
    F.linear for the skinny batches of decoding."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.weight_t = weight.t().contiguous()
        self.bias = bias

    @property
    def out_features(self) -> int:
        return self.weight_t.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            return torch.addmm(self.bias, x, self.weight_t)
        return x @ self.weight_t


class Int8Linear:
    """W8A8: int8 weights per output channel, activations quantized per row at run time.

    Per-row (not per-tensor) activation scales keep each sequence's result independent
    of what else is in the batch.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        weight = weight.float()
        self.weight_scale = (weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0).contiguous()
        q = torch.round(weight / self.weight_scale[:, None]).clamp_(-127, 127)
        self.weight_t = q.to(torch.int8).t().contiguous()
        self.bias = bias

    @property
    def out_features(self) -> int:
        return self.weight_t.shape[1]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(127.0)
        x_q = torch.round(x / x_scale).to(torch.int8)
        y = torch._int_mm(x_q, self.weight_t).float()
        y.mul_(x_scale).mul_(self.weight_scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, quantization: str | None):
    if quantization == "int8":
        return Int8Linear(weight, bias)
    return Linear(weight, bias)
