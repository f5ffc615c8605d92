"""Rotary position embedding (NeoX / rotate-half layout, as HF Llama), with Llama 3 and linear scaling."""

from __future__ import annotations

import math

import torch

from tokenmill.model.arch_config import RopeScaling


def rope_inv_freq(
    head_dim: int,
    theta: float,
    scaling: RopeScaling | None,
    freq_factors: torch.Tensor | None = None,
) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if freq_factors is not None:  # GGUF stores Llama 3 scaling as per-frequency divisors
        return (inv_freq / freq_factors.to(torch.float64)).float()
    if scaling is None:
        return inv_freq.float()
    if scaling.rope_type == "linear":
        return (inv_freq / scaling.factor).float()
    # llama3: keep high frequencies, divide low ones by `factor`, blend in between.
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled).float()


class RotaryEmbedding:
    """Precomputed cos/sin tables, applied in place to query and key heads."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        inv_freq: torch.Tensor,
        device: torch.device | str = "cpu",
    ) -> None:
        self.head_dim = head_dim
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(positions, inv_freq)
        self.cos = freqs.cos().contiguous().to(device)  # [max_positions, head_dim / 2]
        self.sin = freqs.sin().contiguous().to(device)

    def apply(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, num_heads, head_dim] -> rotated copy, in x's dtype (the tables
        rounded to it first, as transformers does)."""
        cos = self.cos[positions].unsqueeze(1).to(x.dtype)
        sin = self.sin[positions].unsqueeze(1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
