"""One step's LoRA deltas: the batch's rows grouped by adapter, and each linear layer's
deltas added to its rows in one of these forms:

- the C kernel (CPU, fp16 adapters): one call per layer for the step's adapters, each
  adapter's rows taken where they are (kernels/csrc/lora_kernels.c);
- segment-grouped matmuls (Punica's SGMV, S-LoRA's batched form): the rows of each adapter
  gathered into a group, the groups padded to the largest, one batched shrink (x·Aᵀ) and one
  batched expand (·Bᵀ) per module, added back to their rows;
- where padding would more than double the work (one adapter's long prompt beside a few
  decodes), one matmul pair per adapter's rows;
- the naive loop over requests, kept as the benchmark's baseline (benchmarks/lora.py)."""

from __future__ import annotations

import torch

from tokenmill.kernels import ops

# the padded form runs while the adapters' row groups, padded to the largest, hold at most
# this many times the step's adapter rows (else one matmul pair per adapter's rows)
PAD_LIMIT = 2


class LoRAStep:
    """One step's rows by adapter, and the deltas they get."""

    def __init__(
        self,
        owner,  # the LoRAModel: its adapters, stacks, device, dtypes, mode and kernel
        rows: dict[str, list[int]],
        requests: list[tuple[str, int, int]],
    ) -> None:
        self.owner = owner
        self.names = tuple(sorted(rows))
        self.requests = requests  # (adapter, first row, rows): the per-request form only
        # the C kernel: (adapters, segment starts, rows) per call; one call for the step's
        # adapters, or one per request (the per-request form)
        self.kernel_calls: list[tuple[tuple[str, ...], torch.Tensor, torch.Tensor]] = []
        self.padded = False
        if owner.kernel:
            if owner.mode == "per_request":
                for name, start, n in requests:
                    ids = list(range(start, start + n))
                    self.kernel_calls.append(((name,), *_segments([ids])))
            else:
                segments = _segments([rows[n] for n in self.names])
                self.kernel_calls.append((self.names, *segments))
            return
        self.rows = {n: _rows(r, owner.device) for n, r in rows.items()}
        counts = [len(rows[n]) for n in self.names]
        width = max(counts)
        # the padded form when padding the groups to the largest costs at most 2x the rows
        self.padded = owner.mode == "batched" and len(counts) * width <= PAD_LIMIT * sum(counts)
        if self.padded:
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
                args = self.owner.stacks.kernel_args(names, layer, group)
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
            weights = self.owner.stacks.segments(self.names, layer, group)
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
