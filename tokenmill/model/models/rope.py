"""Rotary tables of the families beyond Llama: partial rotation (Phi-4-mini), LongRoPE
(Phi-3), YaRN (GPT-OSS) and a per-layer base (Gemma 3's sliding layers)."""

from __future__ import annotations

import math

import torch

from tokenmill.model.arch_config import ArchConfig, RopeScaling
from tokenmill.model.rotary import RotaryEmbedding, rope_inv_freq


class FamilyRotary(RotaryEmbedding):
    """cos/sin tables [max_positions, rotary_dim / 2] (rows may come from different
    frequencies: LongRoPE), applied to the first rotary_dim dims of each head."""

    def __init__(
        self,
        cos: torch.Tensor,
        sin: torch.Tensor,
        head_dim: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.head_dim = head_dim
        self.rotary_dim = 2 * cos.shape[1]
        self.cos = cos.contiguous().to(device)
        self.sin = sin.contiguous().to(device)

    def apply(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.rotary_dim == self.head_dim:
            return super().apply(positions, x)
        rotated = super().apply(positions, x[..., : self.rotary_dim])
        return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)


def _tables(inv_freq: torch.Tensor, positions: torch.Tensor, scale: float = 1.0):
    freqs = torch.outer(positions.float(), inv_freq.float())
    return freqs.cos() * scale, freqs.sin() * scale


def _base_freqs(dim: int, theta: float) -> torch.Tensor:
    return theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def _yarn(dim: int, theta: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    """YaRN: interpolate the low frequencies, keep the high ones, a linear ramp between."""

    def correction_dim(rotations: float) -> float:
        return (
            dim
            * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))
            / (2 * math.log(theta))
        )

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    base = _base_freqs(dim, theta).float()
    inv_freq = (1 / (s.factor * base)) * (1 - extrapolation) + (1 / base) * extrapolation
    attention = s.attention_factor
    if attention is None:
        attention = 0.1 * math.log(s.factor) + 1.0 if s.factor > 1 else 1.0
    return inv_freq, attention


def _longrope_attention(s: RopeScaling) -> float:
    if s.attention_factor is not None:
        return s.attention_factor
    if s.factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(s.factor) / math.log(s.original_max_position_embeddings))


def build_rotary(
    cfg: ArchConfig,
    max_positions: int,
    theta: float | None = None,
    scaling: RopeScaling | None = None,
    freq_factors: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> FamilyRotary:
    """The rotary tables of one layer kind (`theta`: its base, the config's by default),
    computed in float32 on the CPU and kept on `device`."""
    dim = cfg.rotary_dim
    theta = cfg.rope_theta if theta is None else theta
    positions = torch.arange(max_positions)
    if scaling is not None and scaling.rope_type == "yarn":
        inv_freq, attention = _yarn(dim, theta, scaling)
        cos, sin = _tables(inv_freq, positions, attention)
    elif scaling is not None and scaling.rope_type == "longrope":
        # short factors below the original context, long ones from there on (per position,
        # so a sequence's cached keys never change; HF switches the whole step)
        for name in ("short_factor", "long_factor"):
            if len(getattr(scaling, name)) != dim // 2:
                raise ValueError(
                    f"rope_scaling: {name} has {len(getattr(scaling, name))} values, "
                    f"rotary_dim / 2 is {dim // 2}"
                )
        attention = _longrope_attention(scaling)
        base = _base_freqs(dim, theta)
        short = 1 / (torch.tensor(scaling.short_factor, dtype=torch.float64) * base)
        long = 1 / (torch.tensor(scaling.long_factor, dtype=torch.float64) * base)
        cos, sin = _tables(short, positions, attention)
        cut = scaling.original_max_position_embeddings
        if max_positions > cut:
            cos[cut:], sin[cut:] = _tables(long, positions[cut:], attention)
    else:
        cos, sin = _tables(rope_inv_freq(dim, theta, scaling, freq_factors), positions)
    return FamilyRotary(cos, sin, cfg.head_dim, device)
