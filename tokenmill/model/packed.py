"""GGUF block-quantized weights kept as the file stores them (Q4_0, Q4_1, Q8_0): rows of
32-value blocks, each with an fp16 scale (and, for Q4_1, an fp16 minimum). The native linear
method (linear.py) computes with them directly; everything else dequantizes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# GGML type id -> (name, bytes per 32-value block)
PACKED_TYPES = {2: ("Q4_0", 18), 3: ("Q4_1", 20), 8: ("Q8_0", 34)}
BLOCK = 32


@dataclass
class PackedWeight:
    """A [rows, cols] weight as packed rows of blocks (`data`: uint8 [rows, row_bytes])."""

    qtype: int
    rows: int
    cols: int
    data: torch.Tensor

    def __post_init__(self) -> None:
        if self.qtype not in PACKED_TYPES:
            raise ValueError(f"unsupported packed type {self.qtype}")
        if self.cols % BLOCK:
            raise ValueError(f"packed rows need a multiple of {BLOCK} columns, got {self.cols}")
        expected = (self.rows, self.cols // BLOCK * PACKED_TYPES[self.qtype][1])
        if tuple(self.data.shape) != expected or self.data.dtype != torch.uint8:
            raise ValueError(f"packed data {tuple(self.data.shape)} != {expected} uint8")

    @property
    def name(self) -> str:
        return PACKED_TYPES[self.qtype][0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def permute_rows(self, order: np.ndarray) -> PackedWeight:
        """Rows reordered (blocks run along a row, so any row permutation stays exact)."""
        index = torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
        return PackedWeight(self.qtype, self.rows, self.cols, self.data[index].contiguous())

    def dequantize(self) -> torch.Tensor:
        """fp32 [rows, cols], exactly as gguf's reference dequantizer computes it."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(self.data.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


def as_float(weight: torch.Tensor | PackedWeight) -> torch.Tensor:
    return weight.dequantize() if isinstance(weight, PackedWeight) else weight.float()


def cat_rows(parts: list[torch.Tensor | PackedWeight]) -> torch.Tensor | PackedWeight:
    """Stacks weights sharing an input (q/k/v, gate/up); packed parts stay packed when they
    share a format, else all are dequantized."""
    if all(isinstance(p, PackedWeight) for p in parts):
        first = parts[0]
        if all(p.qtype == first.qtype and p.cols == first.cols for p in parts):
            data = torch.cat([p.data for p in parts])
            return PackedWeight(first.qtype, sum(p.rows for p in parts), first.cols, data)
    return torch.cat([as_float(p) for p in parts])
