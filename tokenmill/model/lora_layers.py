"""Multi-LoRA on a running model: requests with different adapters (and none) share one
flat batch. Each linear layer runs its base weights (float or packed) for every row, then
adds the deltas of the step's adapters with segment-grouped matmuls (Punica's SGMV, S-LoRA's
batched form): the rows of each adapter are gathered into one group, the groups padded to
the largest and run as one batched shrink (x·Aᵀ) and one batched expand (·Bᵀ) over the
step's adapters, then added back to their rows: a handful of calls per layer (gather,
shrink, one expand per module of the fused layer, add) whatever the number of adapters or
requests. Where padding would more than double the work (one adapter's long
prompt beside a few decodes) each adapter's rows get their own matmul pair instead.

Weights are never merged; the base layers stay as built (packed blocks included). Each
adapter is packed per fused layer (q/k/v and gate/up share an input): A stacked [R, in],
B block-diagonal [out, R], every group padded to the adapter's widest layer.

On the CPU with fp16 adapter weights (--lora-dtype; the default over a quantized base) one
C call per layer does all of it (kernels/csrc/lora_kernels.c): the weights' bytes are the
cost of a decode step's deltas, and fp16 halves them."""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import torch

from tokenmill.kernels import ops
from tokenmill.model.linear import FloatLinear
from tokenmill.model.lora import LoRAAdapter, check_lora

# fused layer attribute -> the modules whose outputs it concatenates
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}
# the padded form runs while the adapters' row groups, padded to the largest, hold at most
# this many times the step's adapter rows (else one matmul pair per adapter's rows)
PAD_LIMIT = 2
_STACK_CACHE = 8  # batched weights kept for this many sets of adapters


def lora_weight_dtype(choice: str, model, device: torch.device) -> torch.dtype:
    """The adapters' weights' dtype for --lora-dtype `choice` ("auto": on the CPU, float16
    for the C kernel over a quantized or bf16 base, else float32, where the deltas stay
    exact; on a GPU the activations' dtype)."""
    if choice in ("float32", "float16"):
        return getattr(torch, choice)
    if device.type != "cpu":
        return getattr(model.method, "dtype", torch.float32)
    full = not ops.kernels_available() or all(
        _float32_linear(getattr(layer, group)) for layer in model.layers for group in GROUPS
    )
    return torch.float32 if full else torch.float16


def _float32_linear(linear) -> bool:
    """A float32 weight (a packed, int8 or bf16 one is already rounded below fp16)."""
    if isinstance(linear, FloatLinear):
        return True
    weight = getattr(linear, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dtype == torch.float32


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
        self.widths: dict[str, list[int]] = {}  # each module's columns in the group's A
        self.weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.kernel_weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for group, modules in GROUPS.items():
            widths = [self._width(m, layers) for m in modules]
            total = sum(widths)
            if total == 0:
                continue
            self.ranks[group] = total
            self.widths[group] = widths
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

    def to(self, device: torch.device, dtype: torch.dtype) -> _PackedAdapter:
        """On the model's device, in its activations' dtype (bf16 on a GPU)."""
        self.weights = {k: (a.to(device, dtype), bt.to(device, dtype))
                        for k, (a, bt) in self.weights.items()}  # fmt: skip
        return self

    def to_kernel_layout(self, shapes: dict[str, tuple[int, int]]) -> None:
        """fp16 weights in lora_kernels.c's layout: A [R, in]; B each module's [w, out]
        block in column tiles, back to back (the block-diagonal's zeros dropped)."""
        kernel = {}
        for (layer, group), (a, bt) in self.weights.items():
            outs = [shapes[m][1] for m in GROUPS[group]]
            blocks, col, row = [], 0, 0
            for width, out in zip(self.widths[group], outs, strict=True):
                blocks.append(ops.lora_b_tiles(bt[col : col + width, row : row + out]))
                col, row = col + width, row + out
            b = torch.cat(blocks)
            if max(a.abs().max().item(), bt.abs().max().item()) > torch.finfo(torch.float16).max:
                raise ValueError(
                    f"lora_dtype: adapter {self.adapter.name!r} has weights beyond float16's "
                    "range; serve it with --lora-dtype float32"
                )
            kernel[(layer, group)] = (a.half().contiguous(), b.half().contiguous())
        self.kernel_weights = kernel
        self.weights = {}

    def _width(self, module: str, layers: int) -> int:
        ranks = [self.adapter.deltas[(i, module)][0].shape[0] for i in range(layers)
                 if (i, module) in self.adapter.deltas]  # fmt: skip
        return max(ranks, default=0)


class _KernelArgs(NamedTuple):
    """One layer's adapters as lora_sgmv takes them."""

    a_ptrs: int  # address of the array of A pointers
    b_ptrs: int
    widths: torch.Tensor  # int32 rank per adapter and module
    outs: torch.Tensor  # int32 width of each module's output
    arrays: tuple  # the ctypes pointer arrays, alive while the kernel may read them


class LoRAStep:
    """One step's rows by adapter, and the deltas they get."""

    def __init__(
        self,
        owner: LoRAModel,
        rows: dict[str, list[int]],
        requests: list[tuple[str, int, int]],
    ) -> None:
        self.owner = owner
        self.names = sorted(rows)
        self.rows = {n: _rows(r, owner.device) for n, r in rows.items()}
        self.requests = requests  # (adapter, first row, rows): the per-request form only
        counts = [len(rows[n]) for n in self.names]
        width = max(counts)
        # the C kernel: (adapters, segment starts, rows) per call; one call for the step's
        # adapters, or one per request (the per-request form)
        self.kernel_calls: list[tuple[tuple[str, ...], torch.Tensor, torch.Tensor]] = []
        if owner.kernel:
            if owner.mode == "per_request":
                for name, start, n in requests:
                    ids = list(range(start, start + n))
                    self.kernel_calls.append(((name,), *_segments([ids])))
            else:
                segments = _segments([rows[n] for n in self.names])
                self.kernel_calls.append((tuple(self.names), *segments))
        # the padded form when padding the groups to the largest costs at most 2x the rows
        self.padded = owner.mode == "batched" and len(counts) * width <= PAD_LIMIT * sum(counts)
        if self.padded and not owner.kernel:
            index = torch.zeros(len(counts), width, dtype=torch.long)
            valid = torch.zeros(len(counts), width, 1)
            for i, name in enumerate(self.names):
                index[i, : counts[i]] = torch.as_tensor(rows[name])
                valid[i, : counts[i]] = 1.0
            device, dtype = owner.device, owner.weight_dtype
            self.index, self.valid = index.flatten().to(device), valid.to(device, dtype)
            self.shape = (len(counts), width)

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        if self.kernel_calls:
            if x.stride(1) != 1:
                x = x.contiguous()
            for names, seg_start, rows in self.kernel_calls:
                args = self.owner.kernel_args(names, layer, group)
                if args is not None:
                    ops.lora_sgmv(
                        x, y, seg_start, rows, args.a_ptrs, args.b_ptrs, args.widths, args.outs
                    )
            return
        if x.dtype != self.owner.weight_dtype:  # e.g. fp16 adapters beside bf16 activations
            delta = torch.zeros_like(y, dtype=self.owner.weight_dtype)
            self._add_delta(delta, x.to(delta.dtype), layer, group)
            y.add_(delta)
            return
        self._add_delta(y, x, layer, group)

    def _add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        if self.padded:
            weights = self.owner.segment_weights(self.names, layer, group)
            if weights is not None:
                a, parts = weights
                xs = x.index_select(0, self.index).view(*self.shape, x.shape[1])
                t = torch.bmm(xs, a).mul_(self.valid)  # padding rows add nothing
                # q, k, v (gate, up) each its own expand: no block of zeros multiplied
                outs = [torch.bmm(t[:, :, cols], bt) for cols, bt in parts]
                out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
                y.index_add_(0, self.index, out.view(self.index.shape[0], -1))
            return
        if self.owner.mode == "per_request":
            return self._per_request(y, x, layer, group)
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

    def _per_request(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        """The naive form, for comparison only (benchmarks/lora.py): each request's rows
        with its own adapter's matmuls, one request after another."""
        for name, start, n in self.requests:
            packed = self.owner.adapters[name].weights.get((layer, group))
            if packed is not None:
                y[start : start + n].addmm_(x[start : start + n] @ packed[0].T, packed[1])


def _segments(groups: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's int32 segment starts and row ids of these row groups."""
    starts = [0]
    for rows in groups:
        starts.append(starts[-1] + len(rows))
    ids = [r for rows in groups for r in rows]
    return torch.tensor(starts, dtype=torch.int32), torch.tensor(ids, dtype=torch.int32)


def _rows(rows: list[int], device: torch.device) -> slice | torch.Tensor:
    """A contiguous run as a slice (a view: no gather), else an index tensor."""
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return slice(rows[0], rows[0] + len(rows))
    return torch.as_tensor(rows, dtype=torch.long, device=device)


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
        cfg = model.config
        self.shapes = base_shapes(cfg)
        self.num_layers = cfg.num_hidden_layers
        self.adapters: dict[str, _PackedAdapter] = {}
        self.step: LoRAStep | None = None
        # "batched" (segment-grouped, padded groups when balanced); "per_request": the
        # naive loop over requests, kept as the benchmark's baseline
        self.mode = "batched"
        self._stacks: OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor] | None] = OrderedDict()
        self._next_id = 1
        method = model.method
        self.device = torch.device(getattr(method, "device", "cpu"))
        self.dtype = getattr(method, "dtype", torch.float32)  # the activations'
        self.weight_dtype = lora_weight_dtype(lora_dtype, model, self.device)
        # fp16 adapters beside float32 activations on the CPU: the C kernel does the deltas
        self.kernel = (
            self.weight_dtype == torch.float16 and self.device.type == "cpu"
            and self.dtype == torch.float32 and ops.kernels_available()
        )  # fmt: skip
        for i, layer in enumerate(model.layers):
            for group in GROUPS:
                setattr(layer, group, LoRALinear(getattr(layer, group), self, i, group))
        fused = getattr(model, "_fused_decoder", None)
        if fused is not None:  # the one-call decoder reads the base weights only
            model._fused_decoder = lambda kv, attn: self._base_fused(fused, kv, attn)

    def _base_fused(self, fused, kv_caches, attn):
        """The model's one-call decoder for steps without adapter rows, built over the base
        layers (it checks and reads them; the wrappers stay out of its way)."""
        if self.step is not None:
            return None
        wrapped = [(layer, group, getattr(layer, group)) for layer in self.model.layers
                   for group in GROUPS]  # fmt: skip
        for layer, group, linear in wrapped:
            setattr(layer, group, linear.base)
        try:
            return fused(kv_caches, attn)
        finally:
            for layer, group, linear in wrapped:
                setattr(layer, group, linear)

    def add(self, adapter: LoRAAdapter) -> None:
        check_lora(adapter, self.shapes, self.num_layers, self.max_lora_rank)
        adapter.lora_id = self._next_id
        self._next_id += 1
        packed = _PackedAdapter(adapter, self.shapes, self.num_layers)
        if self.kernel:
            packed.to_kernel_layout(self.shapes)
        else:
            packed.to(self.device, self.weight_dtype)
        self.adapters[adapter.name] = packed
        self._stacks.clear()

    def remove(self, name: str) -> None:
        del self.adapters[name]
        self._stacks.clear()

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

    def segment_weights(self, names: list[str], layer: int, group: str):
        """These adapters in this layer, for the batched matmuls: A^T [S, in, R] (each
        module's ranks padded with zeros to the set's widest) and, per module of the group,
        (its columns of R, B^T [S, r, out]); cached per set of adapters.
        None when none of them targets this layer."""
        key = (tuple(names), layer, group)
        if key in self._stacks:
            self._stacks.move_to_end(key)
            return self._stacks[key]
        packed = [self.adapters[n] for n in names]
        modules = GROUPS[group]
        widths = [max((p.widths.get(group, [0] * len(modules))[j] for p in packed), default=0)
                  for j in range(len(modules))]  # fmt: skip
        stack = None
        if sum(widths):
            stack = self._stack(packed, layer, group, widths)
        self._stacks[key] = stack
        if len(self._stacks) > _STACK_CACHE * self.num_layers * len(GROUPS):
            self._stacks.popitem(last=False)
        return stack

    def kernel_args(self, names: tuple[str, ...], layer: int, group: str):
        """These adapters in this layer as the C kernel takes them: (A pointers, B pointers,
        int32 ranks per adapter and module, int32 module widths); cached per set of
        adapters. None when none of them targets this layer."""
        key = ("kernel", names, layer, group)
        if key in self._stacks:
            self._stacks.move_to_end(key)
            return self._stacks[key]
        modules = GROUPS[group]
        a_ptrs = (ctypes.c_void_p * len(names))()
        b_ptrs = (ctypes.c_void_p * len(names))()
        widths = []
        for i, name in enumerate(names):
            packed = self.adapters[name]
            weights = packed.kernel_weights.get((layer, group))
            if weights is None:
                widths += [0] * len(modules)
                continue
            a_ptrs[i], b_ptrs[i] = weights[0].data_ptr(), weights[1].data_ptr()
            widths += packed.widths[group]
        args = None
        if any(widths):
            outs = torch.tensor([self.shapes[m][1] for m in modules], dtype=torch.int32)
            args = _KernelArgs(
                ctypes.addressof(a_ptrs), ctypes.addressof(b_ptrs),
                torch.tensor(widths, dtype=torch.int32), outs, (a_ptrs, b_ptrs),
            )  # fmt: skip
        self._stacks[key] = args
        if len(self._stacks) > _STACK_CACHE * self.num_layers * len(GROUPS):
            self._stacks.popitem(last=False)
        return args

    def _stack(self, packed: list[_PackedAdapter], layer: int, group: str, widths: list[int]):
        """Every module of the group gets an expand (zeros where the set has no rank for
        it), so the expands' outputs side by side are the layer's whole output."""
        modules = GROUPS[group]
        in_dim = self.shapes[modules[0]][0]
        widths = [max(w, 1) for w in widths]  # a zero-width module: one column of zeros
        like = {"device": self.device, "dtype": self.weight_dtype}
        a = torch.zeros(len(packed), in_dim, sum(widths), **like)
        parts = []
        col = row = 0
        for j, module in enumerate(modules):
            out = self.shapes[module][1]
            bt = torch.zeros(len(packed), widths[j], out, **like)
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
