"""GGUF block-quantized weights kept as the file stores them, in ggml's block layouts: rows of
32-value blocks with an fp16 scale (and an fp16 minimum in the _1 formats) in Q4_0, Q4_1, Q5_0,
Q5_1 and Q8_0, or of 256-value super-blocks with 6-bit (Q4_K) or int8 (Q6_K) sub-block scales
in the K formats. The native linear method (linear.py) computes with them directly;
everything else dequantizes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmill.model.gguf_layout import PACKED_TYPES, block_values


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
        values = block_values(self.qtype)
        if self.cols % values:
            raise ValueError(
                f"{self.name} rows need a multiple of {values} columns, got {self.cols}"
            )
        expected = (self.rows, self.cols // values * PACKED_TYPES[self.qtype][1])
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
        # numpy copies whole rows (torch's indexing copies uint8 rows byte by byte: ~40 MB/s)
        rows = self.data.numpy()[np.asarray(order, dtype=np.int64)]
        return PackedWeight(self.qtype, self.rows, self.cols, torch.from_numpy(rows))

    def dequantize(self) -> torch.Tensor:
        """fp32 [rows, cols], exactly as gguf's reference dequantizer computes it."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        values = dequantize(self.data.numpy(), GGMLQuantizationType(self.qtype))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


@dataclass
class Int8Weight:
    """A float weight marked to run as int8 (W8A8) inside a model whose other layers run
    other formats (a mixed quantization plan); the native method quantizes it."""

    weight: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)


@dataclass
class PackedStack:
    """Packed weights sharing an input, stacked by rows, in different formats (llama.cpp's
    K-quant files mix them, e.g. q/k in Q5_0 and v in Q8_0): each part runs in its own."""

    parts: list[PackedWeight]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.rows for p in self.parts), self.parts[0].cols)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])


@dataclass
class OutlierSplit:
    """A packed weight whose few outlier input channels (found by calibration) are kept in
    float32: y = main(x) + x[:, channels] @ dense^T, with those columns zero in `main`, so
    their large values neither lose precision nor widen the block scales of the rest."""

    main: PackedWeight | PackedStack
    channels: torch.Tensor  # int64 [n]
    dense: torch.Tensor  # float32 [rows, n]

    @property
    def shape(self) -> tuple[int, int]:
        return self.main.shape

    @property
    def nbytes(self) -> int:
        return self.main.nbytes + self.dense.numel() * 4

    def dequantize(self) -> torch.Tensor:
        w = self.main.dequantize()
        w[:, self.channels] = self.dense
        return w


def as_float(weight) -> torch.Tensor:
    if isinstance(weight, (PackedWeight, PackedStack, OutlierSplit)):
        return weight.dequantize()
    if isinstance(weight, Int8Weight):
        return weight.weight.float()
    return weight.float()


def cat_rows(parts: list) -> torch.Tensor | PackedWeight | PackedStack | Int8Weight:
    """Stacks weights sharing an input (q/k/v, gate/up): packed parts in one format become
    one packed weight, in several formats a PackedStack; anything else is dequantized."""
    if all(isinstance(p, PackedWeight) for p in parts):
        first = parts[0]
        if all(p.qtype == first.qtype and p.cols == first.cols for p in parts):
            data = torch.cat([p.data for p in parts])
            return PackedWeight(first.qtype, sum(p.rows for p in parts), first.cols, data)
        if all(p.cols == first.cols for p in parts):
            return PackedStack(list(parts))
    if all(isinstance(p, Int8Weight) for p in parts):
        return Int8Weight(torch.cat([p.weight for p in parts]))
    if all(isinstance(p, OutlierSplit) for p in parts) and all(
        torch.equal(p.channels, parts[0].channels) for p in parts
    ):
        main = cat_rows([p.main for p in parts])
        if not isinstance(main, torch.Tensor):
            return OutlierSplit(main, parts[0].channels, torch.cat([p.dense for p in parts]))
    return torch.cat([as_float(p) for p in parts])
