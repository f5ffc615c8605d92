"""A layer's experts as stacked weights on a device, run with torch's grouped matmul
(`torch._grouped_mm`, as torchtitan's MoE): the rows sorted by expert go through two matmuls
per layer whatever the number of experts, the groups' ends computed on the device, so there
is no host sync and a decode step can be captured in a CUDA graph.

Built where the experts are plain device layers (DeviceMethod in bf16 or fp32) and the
device's grouped matmul runs them (checked once at load against F.linear); FP8 experts and
the CPU's packed ones run expert by expert (moe.py). The experts keep views of the stacked
weights: one copy in memory."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from tokenmill.model.device_method import DeviceLinear, DeviceMethod


class GroupedExperts:
    def __init__(self, experts: list, activate: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.gate_up = _stack_weights([e.gate_up_proj for e in experts])  # [E, 2I, H]
        self.down = _stack_weights([e.down_proj for e in experts])  # [E, H, I]
        self.gate_up_bias = _stack_biases([e.gate_up_proj for e in experts])  # [E, 2I] | None
        self.down_bias = _stack_biases([e.down_proj for e in experts])
        self.activate = activate

    @classmethod
    def build(cls, experts: list, method) -> GroupedExperts | None:
        """The layer's experts grouped, or None where they run one at a time."""
        if not isinstance(method, DeviceMethod) or not hasattr(torch, "_grouped_mm"):
            return None
        layers = [layer for e in experts for layer in (e.gate_up_proj, e.down_proj)]
        if not all(isinstance(layer, DeviceLinear) for layer in layers):
            return None  # FP8 experts: the scaled matmul, expert by expert
        if not _grouped_mm_runs(method.device, method.dtype):
            return None
        return cls(experts, experts[0].activate)

    def __call__(
        self, x: torch.Tensor, expert_of_row: torch.Tensor, counts: torch.Tensor
    ) -> torch.Tensor:
        """x: rows sorted by expert; expert_of_row: each row's expert; counts: rows per
        expert. The experts' outputs, row for row."""
        ends = counts.cumsum(0).to(torch.int32)
        h = torch._grouped_mm(x, self.gate_up.transpose(1, 2), offs=ends)
        if self.gate_up_bias is not None:
            h = h + self.gate_up_bias[expert_of_row]
        y = torch._grouped_mm(self.activate(h), self.down.transpose(1, 2), offs=ends)
        if self.down_bias is not None:
            y = y + self.down_bias[expert_of_row]
        return y


def _stack_weights(layers: list[DeviceLinear]) -> torch.Tensor:
    stacked = torch.stack([layer.weight for layer in layers])
    for layer, weight in zip(layers, stacked, strict=True):
        layer.weight = weight  # a view: the stack is the only copy
    return stacked


def _stack_biases(layers: list[DeviceLinear]) -> torch.Tensor | None:
    if all(layer.bias is None for layer in layers):
        return None
    stacked = torch.stack([layer.bias for layer in layers])
    for layer, bias in zip(layers, stacked, strict=True):
        layer.bias = bias
    return stacked


_RUNS: dict[tuple[str, torch.dtype], bool] = {}


def _grouped_mm_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this device's grouped matmul takes this dtype and agrees with F.linear (an
    empty group included); asked once per device and dtype."""
    key = (str(device), dtype)
    if key not in _RUNS:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(3, 32, 16, generator=gen).to(device, dtype)  # [E, out, in]
        x = torch.randn(5, 16, generator=gen).to(device, dtype)
        ends = torch.tensor([2, 2, 5], dtype=torch.int32, device=device)
        try:
            got = torch._grouped_mm(x, w.transpose(1, 2), offs=ends).float()
        except (RuntimeError, NotImplementedError):
            _RUNS[key] = False
            return False
        want = torch.cat([F.linear(x[:2], w[0]), F.linear(x[2:], w[2])]).float()
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        _RUNS[key] = bool(torch.allclose(got, want, atol=tol * 4, rtol=tol))
    return _RUNS[key]
