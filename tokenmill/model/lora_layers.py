"""Multi-LoRA on a running model: requests with different adapters (and none) share one
flat batch. Each linear layer runs its base weights (float or packed) for every row, then
adds the deltas of the step's adapters with batched matmuls over row groups:

- few rows (decode-heavy steps): one shrink and one expand GEMM over the stacked adapters
  of the step, each row keeping only its own adapter's columns (a 0/1 mask): two calls per
  layer whatever the number of adapters (S-LoRA's batched form);
- many rows (prefill): one shrink/expand pair per adapter over that adapter's rows (the
  segment-grouped form of Punica's SGMV), so no row pays for another adapter's rank.

Weights are never merged; the base layers stay as built (packed blocks included). Each
adapter is packed per fused layer (q/k/v and gate/up share an input): A stacked
[R, in], B block-diagonal [out, R], every group padded to the adapter's widest layer so a
step's column layout is the same in every layer."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

from tokenmill.model.lora import LoRAAdapter, check_lora

# fused layer attribute -> the modules whose outputs it concatenates
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
# steps with at most this many rows x adapters run the stacked form
STACKED_MAX_WORK = 512
_STACK_CACHE = 8  # stacked weights kept for this many sets of adapters


def base_shapes(cfg) -> dict[str, tuple[int, int]]:
    """module -> (in, out) of a Llama-family decoder layer."""
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }  # fmt: skip


class _PackedAdapter:
    """One adapter as the layers use it: (layer, group) -> (A [R, in], B^T [R, out])."""

    def __init__(self, adapter: LoRAAdapter, shapes: dict[str, tuple[int, int]], layers: int):
        self.adapter = adapter
        self.ranks: dict[str, int] = {}
        self.weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for group, modules in GROUPS.items():
            widths = [self._width(m, layers) for m in modules]
            total = sum(widths)
            if total == 0:
                continue
            self.ranks[group] = total
            in_dim = shapes[modules[0]][0]
            out_dims = [shapes[m][1] for m in modules]
            for layer in range(layers):
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

    def _width(self, module: str, layers: int) -> int:
        ranks = [self.adapter.deltas[(i, module)][0].shape[0] for i in range(layers)
                 if (i, module) in self.adapter.deltas]  # fmt: skip
        return max(ranks, default=0)


class LoRAStep:
    """One step's rows by adapter, and the deltas they get."""

    def __init__(self, owner: LoRAModel, rows: dict[str, list[int]], num_rows: int) -> None:
        self.owner = owner
        self.names = sorted(rows)
        self.rows = {n: _rows(r) for n, r in rows.items()}
        self.stacked = num_rows * len(self.names) <= STACKED_MAX_WORK
        self.masks: dict[str, torch.Tensor] = {}
        if self.stacked:
            owners = torch.full((num_rows,), -1, dtype=torch.long)
            for i, name in enumerate(self.names):
                owners[torch.as_tensor(rows[name])] = i
            for group in GROUPS:
                cols = [
                    torch.full((owner.adapters[n].ranks.get(group, 0),), i, dtype=torch.long)
                    for i, n in enumerate(self.names)
                ]
                column_owner = torch.cat(cols)
                self.masks[group] = (owners[:, None] == column_owner[None, :]).float()

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        if self.stacked:
            stack = self.owner.stacked(self.names, layer, group)
            if stack is not None:
                t = (x @ stack[0].T).mul_(self.masks[group])
                y.addmm_(t, stack[1])
            return
        for name in self.names:
            packed = self.owner.adapters[name].weights.get((layer, group))
            if packed is None:
                continue
            a, bt = packed
            rows = self.rows[name]
            if isinstance(rows, slice):
                y[rows].addmm_(x[rows] @ a.T, bt)
            else:
                y.index_add_(0, rows, (x.index_select(0, rows) @ a.T) @ bt)


def _rows(rows: list[int]) -> slice | torch.Tensor:
    """A contiguous run as a slice (a view: no gather), else an index tensor."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.as_tensor(rows, dtype=torch.long)


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

    def __init__(self, model, max_loras: int, max_lora_rank: int) -> None:
        self.model = model
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        cfg = model.config
        self.shapes = base_shapes(cfg)
        self.num_layers = cfg.num_hidden_layers
        self.adapters: dict[str, _PackedAdapter] = {}
        self.step: LoRAStep | None = None
        self._stacks: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor] | None] = OrderedDict()
        self._next_id = 1
        for i, layer in enumerate(model.layers):
            for group in GROUPS:
                setattr(layer, group, LoRALinear(getattr(layer, group), self, i, group))
        fused = getattr(model, "_fused_decoder", None)
        if fused is not None:  # the one-call decoder reads the base weights only
            model._fused_decoder = lambda kv, attn: (
                None if self.step is not None else fused(kv, attn)
            )

    def add(self, adapter: LoRAAdapter) -> None:
        check_lora(adapter, self.shapes, self.num_layers, self.max_lora_rank)
        adapter.lora_id = self._next_id
        self._next_id += 1
        self.adapters[adapter.name] = _PackedAdapter(adapter, self.shapes, self.num_layers)
        self._stacks.clear()

    def remove(self, name: str) -> None:
        del self.adapters[name]
        self._stacks.clear()

    def begin_step(self, rows: Sequence[tuple[str | None, int, int]], num_rows: int) -> None:
        """`rows`: (adapter or None, first row, row count) of each request in the batch."""
        by_name: dict[str, list[int]] = {}
        for name, start, n in rows:
            if name is not None:
                by_name.setdefault(name, []).extend(range(start, start + n))
        self.step = LoRAStep(self, by_name, num_rows) if by_name else None

    def end_step(self) -> None:
        self.step = None

    def stacked(self, names: list[str], layer: int, group: str):
        """(A [sum R, in], B^T [sum R, out]) of these adapters in this layer, cached."""
        key = (tuple(names), layer, group)
        if key in self._stacks:
            self._stacks.move_to_end(key)
            return self._stacks[key]
        parts = [self.adapters[n].weights.get((layer, group)) for n in names]
        parts = [p for p in parts if p is not None]
        stack = (
            (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])) if parts else None
        )
        self._stacks[key] = stack
        if len(self._stacks) > _STACK_CACHE * self.num_layers * len(GROUPS):
            self._stacks.popitem(last=False)
        return stack
