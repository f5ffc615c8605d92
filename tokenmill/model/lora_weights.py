"""The adapters' weights as the deltas read them: each adapter packed per fused layer
(q/k/v and gate/up share an input: A stacked [R, in], B block-diagonal, every module padded
to the adapter's widest layer), in the adapters' dtype; in the C kernel's fp16 layout on the
CPU; and, per set of adapters a step mixes, stacked for batched matmuls or as the kernel's
pointer arrays (cached)."""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from typing import NamedTuple

import torch

from tokenmill.kernels import ops
from tokenmill.model.linear import FloatLinear
from tokenmill.model.lora import LoRAAdapter
from tokenmill.model.lora_targets import LoRATargets

_STACK_CACHE = 8  # batched weights kept for this many sets of adapters


def lora_weight_dtype(choice: str, model, targets: LoRATargets, device) -> torch.dtype:
    """The adapters' weights' dtype for --lora-dtype `choice` ("auto": on the CPU, float16
    for the C kernel over a quantized or bf16 base, else float32, where the deltas stay
    exact; on a GPU the activations' dtype)."""
    if choice in ("float32", "float16"):
        return getattr(torch, choice)
    if device.type != "cpu":
        return getattr(model.method, "dtype", torch.float32)
    full = not ops.kernels_available() or all(
        _float32_linear(getattr(holder, group)) for _, group, holder in targets.linears()
    )
    return torch.float32 if full else torch.float16


def _float32_linear(linear) -> bool:
    """A float32 weight (a packed, int8 or bf16 one is already rounded below fp16)."""
    if isinstance(linear, FloatLinear):
        return True
    weight = getattr(linear, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dtype == torch.float32


class PackedAdapter:
    """One adapter as the layers use it: (layer, group) -> (A [R, in], B^T [R, out])."""

    def __init__(self, adapter: LoRAAdapter, targets: LoRATargets) -> None:
        self.adapter = adapter
        self.widths: dict[str, list[int]] = {}  # each module's columns in the group's A
        self.weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.kernel_weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        shapes = targets.shapes
        for group, modules in targets.groups.items():
            widths = [self._width(m, targets.num_layers) for m in modules]
            total = sum(widths)
            if total == 0:
                continue
            self.widths[group] = widths
            in_dim = shapes[modules[0]][0]
            out_dims = [shapes[m][1] for m in modules]
            for layer in range(targets.num_layers):
                if not any((layer, m) in adapter.deltas for m in modules):
                    continue
                a = torch.zeros(total, in_dim)
                bt = torch.zeros(total, sum(out_dims))
                col = row = 0
                for module, width, out in zip(modules, widths, out_dims, strict=True):
                    delta = adapter.deltas.get((layer, module))
                    if delta is not None:
                        r = delta[0].shape[0]
                        a[col : col + r] = delta[0]
                        bt[col : col + r, row : row + out] = delta[1].T
                    col, row = col + width, row + out
                self.weights[(layer, group)] = (a, bt)

    def to(self, device: torch.device, dtype: torch.dtype) -> None:
        """On the model's device, in the adapters' dtype."""
        self.weights = {k: (a.to(device, dtype), bt.to(device, dtype))
                        for k, (a, bt) in self.weights.items()}  # fmt: skip

    def to_kernel_layout(self, targets: LoRATargets) -> None:
        """fp16 weights in lora_kernels.c's layout: A [R, in]; B each module's [w, out]
        block in column tiles, back to back (the block-diagonal's zeros dropped)."""
        limit = torch.finfo(torch.float16).max
        kernel = {}
        for (layer, group), (a, bt) in self.weights.items():
            if max(a.abs().max().item(), bt.abs().max().item()) > limit:
                raise ValueError(
                    f"lora_dtype: adapter {self.adapter.name!r} has weights beyond float16's "
                    "range; serve it with --lora-dtype float32"
                )
            outs = [targets.shapes[m][1] for m in targets.groups[group]]
            blocks, col, row = [], 0, 0
            for width, out in zip(self.widths[group], outs, strict=True):
                blocks.append(ops.lora_b_tiles(bt[col : col + width, row : row + out]))
                col, row = col + width, row + out
            kernel[(layer, group)] = (a.half().contiguous(), torch.cat(blocks))
        self.kernel_weights = kernel
        self.weights = {}

    def _width(self, module: str, layers: int) -> int:
        ranks = [self.adapter.deltas[(i, module)][0].shape[0] for i in range(layers)
                 if (i, module) in self.adapter.deltas]  # fmt: skip
        return max(ranks, default=0)


class KernelArgs(NamedTuple):
    """One layer's adapters as ops.lora_sgmv takes them."""

    a_ptrs: int  # address of the array of A pointers
    b_ptrs: int
    widths: torch.Tensor  # int32 rank per adapter and module
    outs: torch.Tensor  # int32 width of each module's output
    arrays: tuple  # the ctypes pointer arrays, alive while the kernel may read them


class StackedWeights:
    """A set of adapters' weights in one layer, for one step's form of the deltas: stacked
    for the batched matmuls or as the kernel's arguments; cached per set of adapters."""

    def __init__(self, targets: LoRATargets, adapters: dict[str, PackedAdapter], like: dict):
        self.targets = targets
        self.adapters = adapters
        self.like = like  # device and dtype of the stacks
        self._cache: OrderedDict[tuple, object] = OrderedDict()

    def clear(self) -> None:
        self._cache.clear()

    def _cached(self, key: tuple, build):
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        value = self._cache[key] = build()
        if len(self._cache) > _STACK_CACHE * self.targets.num_layers * len(self.targets.groups):
            self._cache.popitem(last=False)
        return value

    def segments(self, names: tuple[str, ...], layer: int, group: str):
        """A^T [S, in, R] (each module's ranks padded with zeros to the set's widest) and,
        per module of the group, (its columns of R, B^T [S, r, out]). None when none of the
        adapters targets this layer."""
        return self._cached(("stack", names, layer, group),
                            lambda: self._stack(names, layer, group))  # fmt: skip

    def kernel_args(self, names: tuple[str, ...], layer: int, group: str) -> KernelArgs | None:
        return self._cached(("kernel", names, layer, group),
                            lambda: self._kernel_args(names, layer, group))  # fmt: skip

    def _stack(self, names: tuple[str, ...], layer: int, group: str):
        """Every module of the group gets an expand (zeros where the set has no rank for
        it), so the expands' outputs side by side are the layer's whole output."""
        packed = [self.adapters[n] for n in names]
        if not any((layer, group) in p.weights for p in packed):
            return None
        modules = self.targets.groups[group]
        shapes = self.targets.shapes
        widths = [
            max(max(p.widths.get(group, [0] * len(modules))[j] for p in packed), 1)
            for j in range(len(modules))
        ]  # fmt: skip  (zero-width: a column of zeros)
        a = torch.zeros(len(packed), shapes[modules[0]][0], sum(widths), **self.like)
        parts = []
        col = row = 0
        for j, module in enumerate(modules):
            out = shapes[module][1]
            bt = torch.zeros(len(packed), widths[j], out, **self.like)
            for i, p in enumerate(packed):
                if (layer, group) not in p.weights:
                    continue
                src_a, src_bt = p.weights[(layer, group)]
                own = p.widths[group]
                start = sum(own[:j])
                a[i, :, col : col + own[j]] = src_a[start : start + own[j]].T
                bt[i, : own[j]] = src_bt[start : start + own[j], row : row + out]
            parts.append((slice(col, col + widths[j]), bt))
            col, row = col + widths[j], row + out
        return a, parts

    def _kernel_args(self, names: tuple[str, ...], layer: int, group: str) -> KernelArgs | None:
        modules = self.targets.groups[group]
        a_ptrs = (ctypes.c_void_p * len(names))()
        b_ptrs = (ctypes.c_void_p * len(names))()
        widths: list[int] = []
        for i, name in enumerate(names):
            packed = self.adapters[name]
            weights = packed.kernel_weights.get((layer, group))
            if weights is None:
                widths += [0] * len(modules)
                continue
            a_ptrs[i], b_ptrs[i] = weights[0].data_ptr(), weights[1].data_ptr()
            widths += packed.widths[group]
        if not any(widths):
            return None
        outs = [self.targets.shapes[m][1] for m in modules]
        return KernelArgs(
            ctypes.addressof(a_ptrs), ctypes.addressof(b_ptrs),
            torch.tensor(widths, dtype=torch.int32), torch.tensor(outs, dtype=torch.int32),
            (a_ptrs, b_ptrs),
        )  # fmt: skip
