"""Weight formats a float weight can be quantized to at load, as GGUF blocks the native
kernels run (Q8_0, Q5_1, Q5_0, Q4_1, Q4_0), with gguf-py's reference quantizers (the same
rounding as llama.cpp's `*_ref` functions), and fast torch fake-quantizers of the same
formats for calibration searches (which quantize many candidates and keep none)."""

from __future__ import annotations

import numpy as np
import torch

from tokenmill.model.packed import PackedWeight
from tokenmill.quant.schemes import AT_LOAD_FORMATS


def quantize_weight(weight: torch.Tensor, fmt: str) -> PackedWeight:
    """A float [rows, cols] weight as packed GGUF blocks of `fmt` (cols a multiple of 32)."""
    import gguf
    from gguf.quants import quantize

    qtype = gguf.GGMLQuantizationType[AT_LOAD_FORMATS[fmt]]
    rows, cols = weight.shape
    data = quantize(weight.detach().float().numpy(), qtype)
    return PackedWeight(int(qtype), rows, cols, torch.from_numpy(np.ascontiguousarray(data)))


def _fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).float()


def fake_quantize(weight: torch.Tensor, fmt: str) -> torch.Tensor:
    """weight rounded through `fmt` and back (float32), as the packed format would hold it;
    for searches (matches quantize_weight(...).dequantize() up to rare rounding ties)."""
    if fmt == "float32":
        return weight.float()
    if fmt == "int8":  # per output channel, symmetric (Int8Linear)
        scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
        return torch.round(weight / scale).clamp_(-127, 127) * scale
    rows, cols = weight.shape
    blocks = weight.float().reshape(rows, cols // 32, 32)
    if fmt == "q8_0":
        d = blocks.abs().amax(-1, keepdim=True) / 127.0
        inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
        scaled = blocks * inv
        q = torch.sign(scaled) * torch.floor(scaled.abs() + 0.5)  # roundf: ties away from 0
        return (q * _fp16(d)).reshape(rows, cols)
    if fmt in ("q4_0", "q5_0"):
        levels = 8.0 if fmt == "q4_0" else 16.0
        idx = blocks.abs().argmax(-1, keepdim=True)
        signed_max = blocks.gather(-1, idx)
        d = signed_max / -levels
        inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
        q = torch.clamp(torch.trunc(blocks * inv + (levels + 0.5)), 0, 2 * levels - 1)
        return ((q - levels) * _fp16(d)).reshape(rows, cols)
    if fmt in ("q4_1", "q5_1"):
        top = 15.0 if fmt == "q4_1" else 31.0
        lo = blocks.amin(-1, keepdim=True)
        hi = blocks.amax(-1, keepdim=True)
        d = (hi - lo) / top
        inv = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
        q = torch.clamp(torch.trunc((blocks - lo) * inv + 0.5), 0, top)
        return (q * _fp16(d) + _fp16(lo)).reshape(rows, cols)
    raise ValueError(f"no fake quantizer for {fmt!r}")
