"""Multi-LoRA on a running model: requests with different adapters (and none) share one
flat batch. Each targeted linear layer (model/lora_targets.py) runs its base weights (float
or packed) for every row, then adds the deltas of the step's adapters (model/lora_step.py).
Weights are never merged; the base layers stay as built (packed blocks included)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tokenmill.kernels import ops
from tokenmill.model.lora import LoRAAdapter
from tokenmill.model.lora_step import LoRAStep
from tokenmill.model.lora_targets import LoRATargets
from tokenmill.model.lora_weights import PackedAdapter, StackedWeights, lora_weight_dtype


class LoRALinear:
    """A base linear layer (any method's) plus the step's LoRA deltas."""

    def __init__(self, base, owner: LoRAModel, layer: int, group: str) -> None:
        self.base = base
        self.owner = owner
        self.layer = layer
        self.group = group

    def __call__(self, x, residual: torch.Tensor | None = None) -> torch.Tensor:
        y = self.base(x, residual)
        step = self.owner.step
        if step is not None:
            if not isinstance(x, torch.Tensor):  # an int8 method's (rows, scales)
                x = x[0].float() * x[1]
            step.add_delta(y, x, self.layer, self.group)
        return y

    def __getattr__(self, name: str):
        return getattr(self.base, name)  # what callers read of the base layer


class LoRAModel:
    """The adapters a model serves, and its layers wrapped to apply them."""

    def __init__(self, model, max_loras: int, max_lora_rank: int, lora_dtype: str = "auto") -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.targets = LoRATargets(model)
        self.adapters: dict[str, PackedAdapter] = {}
        self.step: LoRAStep | None = None
        # "batched" (the kernel, or segment-grouped matmuls); "per_request": the naive loop
        # over requests, kept as the benchmark's baseline
        self.mode = "batched"
        self._next_id = 1
        method = model.method
        self.device = torch.device(getattr(method, "device", "cpu"))
        self.dtype = getattr(method, "dtype", torch.float32)  # the activations'
        self.weight_dtype = lora_weight_dtype(lora_dtype, model, self.targets, self.device)
        # fp16 adapters beside float32 activations on the CPU: the C kernel does the deltas
        self.kernel = (
            self.weight_dtype == torch.float16 and self.device.type == "cpu"
            and self.dtype == torch.float32 and ops.kernels_available()
        )  # fmt: skip
        like = {"device": self.device, "dtype": self.weight_dtype}
        self.stacks = StackedWeights(self.targets, self.adapters, like)
        for layer, group, holder in self.targets.linears():
            setattr(holder, group, LoRALinear(getattr(holder, group), self, layer, group))
        fused = getattr(model, "_fused_decoder", None)
        if fused is not None:  # the one-call decoder reads the base weights only
            model._fused_decoder = lambda kv, attn: self._base_fused(fused, kv, attn)

    def _base_fused(self, fused, kv_caches, attn):
        """The model's one-call decoder for steps without adapter rows, built over the base
        layers (it checks and reads them; the wrappers stay out of its way)."""
        if self.step is not None:
            return None
        wrapped = [(holder, group, getattr(holder, group))
                   for _, group, holder in self.targets.linears()]  # fmt: skip
        for holder, group, linear in wrapped:
            setattr(holder, group, linear.base)
        try:
            return fused(kv_caches, attn)
        finally:
            for holder, group, linear in wrapped:
                setattr(holder, group, linear)

    def add(self, adapter: LoRAAdapter) -> None:
        self.targets.check(adapter, self.max_lora_rank)
        packed = PackedAdapter(adapter, self.targets)
        if self.kernel:
            packed.to_kernel_layout(self.targets)
        else:
            packed.to(self.device, self.weight_dtype)
        adapter.lora_id = self._next_id
        self._next_id += 1
        self.adapters[adapter.name] = packed
        self.stacks.clear()

    def remove(self, name: str) -> None:
        del self.adapters[name]
        self.stacks.clear()

    def begin_step(self, rows: Sequence[tuple[str | None, int, int]], num_rows: int) -> None:
        """`rows`: (adapter or None, first row, row count) of each request in the batch."""
        by_name: dict[str, list[int]] = {}
        requests = []
        for name, start, n in rows:
            if name is not None:
                by_name.setdefault(name, []).extend(range(start, start + n))
                requests.append((name, start, n))
        self.step = LoRAStep(self, by_name, requests) if by_name else None

    def end_step(self) -> None:
        self.step = None
