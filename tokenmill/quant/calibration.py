"""Calibration: per-input-channel scales from activation statistics, folded into the
operation before each linear layer, so the quantized layer sees its outlier channels
shrunk in the activation and grown in the weight (or the reverse) — the same function in
float, less error once quantized.

  weight-only formats (q4_0 ... q8_0): AWQ's scale s = mean|x|^a (normalized), which
      protects the weight columns that meet large activations;
  int8 (W8A8): SmoothQuant's s = max|x|^a / max|w|^(1-a), which moves activation outliers
      (quantized per row) into the weights (quantized per channel).

For each group the exponent a is searched on a grid against the layer's output error on the
calibration activations, with "no scaling" as a candidate, so a group is only rescaled
where that measurably lowers its error. Scales fold exactly: into the RMSNorm weight before
q/k/v and gate/up, into the rows of v_proj before o_proj (one scale per KV-head channel
when heads share KV heads) and into the rows of up_proj before down_proj.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tokenmill.model.arch_config import ArchConfig
from tokenmill.model.linear import FloatMethod
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.quant.formats import fake_quantize
from tokenmill.quant.groups import layer_group_weights
from tokenmill.quant.kld import make_chunks
from tokenmill.quant.scoring import ModelScorer

logger = logging.getLogger(__name__)

ALPHAS = tuple(i / 10 for i in range(11))
_SAMPLE_ROWS = 512  # activation rows per group kept for the error search
_CTX = 512
_MAX_CHUNKS = 4


@dataclass
class ActivationStats:
    sum_abs: torch.Tensor  # [K] float64
    max_abs: torch.Tensor  # [K]
    count: int
    sample: torch.Tensor  # [<= _SAMPLE_ROWS, K]

    @property
    def mean_abs(self) -> torch.Tensor:
        return (self.sum_abs / max(1, self.count)).float()


class _Recorder:
    """Stands in for a linear layer: records its input, then runs it."""

    def __init__(self, linear, generator: torch.Generator) -> None:
        self.linear = linear
        self.generator = generator
        self.stats: ActivationStats | None = None

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        xa = x.abs()
        rows = torch.randperm(x.shape[0], generator=self.generator)[:_SAMPLE_ROWS]
        if self.stats is None:
            self.stats = ActivationStats(
                xa.sum(0, dtype=torch.float64), xa.amax(0), x.shape[0], x[rows].clone()
            )
        else:
            s = self.stats
            s.sum_abs += xa.sum(0, dtype=torch.float64)
            s.max_abs = torch.maximum(s.max_abs, xa.amax(0))
            s.count += x.shape[0]
            s.sample = torch.cat([s.sample, x[rows]])[-_SAMPLE_ROWS:]
        return self.linear(x, residual)


_PROJECTIONS = {
    "attn_qkv": "qkv_proj",
    "attn_o": "o_proj",
    "mlp_gate_up": "gate_up_proj",
    "mlp_down": "down_proj",
}


def collect_activation_stats(
    arch: ArchConfig, weights: dict[str, torch.Tensor], token_ids: list[int], bos: int | None
) -> dict[str, ActivationStats]:
    """Inputs of every linear layer of the float model over the calibration tokens."""
    chunks = make_chunks(token_ids, min(_CTX, len(token_ids)), _MAX_CHUNKS, bos)
    model = LlamaForCausalLM(arch, dict(weights), chunks.ctx, FloatMethod())
    generator = torch.Generator().manual_seed(0)
    recorders: dict[str, _Recorder] = {}
    for i, layer in enumerate(model.layers):
        for kind, attr in _PROJECTIONS.items():
            recorders[f"layers.{i}.{kind}"] = rec = _Recorder(getattr(layer, attr), generator)
            setattr(layer, attr, rec)
    ModelScorer(model, chunks.ctx, len(chunks.chunks)).hidden_states(chunks.chunks)
    return {group: rec.stats for group, rec in recorders.items() if rec.stats is not None}


def _quantize_rows(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127.0
    return torch.round(x / scale).clamp_(-127, 127) * scale


@dataclass(frozen=True)
class ScaleChoice:
    alpha: float | None  # None: no scaling won
    scale: torch.Tensor | None
    error_before: float
    error_after: float


def search_scale(weight: torch.Tensor, stats: ActivationStats, fmt: str, tie=None) -> ScaleChoice:
    """The per-input-channel scale (or none) that minimizes the group's output error."""
    x = stats.sample.float()
    reference = x @ weight.t()
    w_max = weight.abs().amax(0).clamp_min(1e-8)

    def error(s: torch.Tensor | None) -> float:
        xs, w = (x, weight) if s is None else (x / s, weight * s)
        if fmt == "int8":
            xs = _quantize_rows(xs)
        return (xs @ fake_quantize(w, fmt).t() - reference).pow(2).mean().item()

    before = error(None)
    best = ScaleChoice(None, None, before, before)
    for alpha in ALPHAS:
        if fmt == "int8":
            s = stats.max_abs.clamp_min(1e-5).pow(alpha) / w_max.pow(1 - alpha)
        else:
            s = stats.mean_abs.clamp_min(1e-8).pow(alpha)
            s = s / (s.max() * s.min()).sqrt()
        s = s.clamp(1e-4, 1e4)
        if tie is not None:
            s = tie(s)
        err = error(s)
        if err < best.error_after:
            best = ScaleChoice(alpha, s, before, err)
    return best


def _kv_tie(arch: ArchConfig):
    """o_proj's input channels of heads sharing a KV head must share a scale (it folds into
    that KV head's v rows): geometric mean over the group."""
    group = arch.num_attention_heads // arch.num_key_value_heads

    def tie(s: torch.Tensor) -> torch.Tensor:
        per_kv = s.view(arch.num_key_value_heads, group, arch.head_dim).log().mean(1).exp()
        return per_kv[:, None, :].expand(-1, group, -1).reshape(-1)

    return tie


def select_outlier_channels(
    arch: ArchConfig,
    weights: dict[str, torch.Tensor],
    stats: dict[str, ActivationStats],
    choices: dict[str, ScaleChoice],
    count: int,
) -> dict[str, torch.Tensor]:
    """Per group, the `count` input channels that carry the most signal, mean|x_j| times
    the norm of weight column j (after the scales are folded: the product does not change
    under them); the plan keeps these in float32."""
    chosen = {}
    for i in range(arch.num_hidden_layers):
        for kind, names in layer_group_weights(i).items():
            group = f"layers.{i}.{kind}"
            if group not in choices or group not in stats:
                continue
            w = torch.cat([weights[n] for n in names])
            x_mean = stats[group].mean_abs
            if choices[group].scale is not None:
                x_mean = x_mean / choices[group].scale
            importance = x_mean * w.norm(dim=0)
            n = min(count, w.shape[1] // 4)
            chosen[group] = importance.topk(n).indices.sort().values
    return chosen


def calibrate(
    arch: ArchConfig,
    weights: dict[str, torch.Tensor],
    stats: dict[str, ActivationStats],
    format_for,
    on_layer: Callable[[], None] | None = None,
) -> dict[str, ScaleChoice]:
    """Searches and folds the scales into `weights` (float, Hugging Face names) in place.
    `format_for(group)` is the format the group will be quantized to; `on_layer()` after
    each layer (progress)."""
    choices = {}
    for i in range(arch.num_hidden_layers):
        p = f"model.layers.{i}."
        fused = layer_group_weights(i)
        plans = {}
        for kind, names in fused.items():
            group = f"layers.{i}.{kind}"
            fmt = format_for(group)
            if fmt == "float32" or group not in stats:
                continue
            weight = torch.cat([weights[n] for n in names])
            tie = _kv_tie(arch) if kind == "attn_o" else None
            choice = search_scale(weight, stats[group], fmt, tie)
            choices[group] = choice
            if choice.scale is not None:
                plans[kind] = (names, choice.scale)
        for kind, (names, s) in plans.items():
            for n in names:
                weights[n] = weights[n] * s  # columns
            if kind == "attn_qkv":
                weights[p + "input_layernorm.weight"] = weights[p + "input_layernorm.weight"] / s
            elif kind == "mlp_gate_up":
                key = p + "post_attention_layernorm.weight"
                weights[key] = weights[key] / s
            elif kind == "mlp_down":
                key = p + "mlp.up_proj.weight"
                weights[key] = weights[key] / s[:, None]
            else:  # attn_o: fold into v rows (one scale per KV-head channel)
                group = arch.num_attention_heads // arch.num_key_value_heads
                s_kv = s.view(arch.num_key_value_heads, group, arch.head_dim)[:, 0].reshape(-1)
                key = p + "self_attn.v_proj.weight"
                weights[key] = weights[key] / s_kv[:, None]
                if p + "self_attn.v_proj.bias" in weights:
                    weights[p + "self_attn.v_proj.bias"] = (
                        weights[p + "self_attn.v_proj.bias"] / s_kv
                    )
        if on_layer is not None:
            on_layer()
    scaled = sum(c.scale is not None for c in choices.values())
    logger.info("calibration: %d of %d groups rescaled", scaled, len(choices))
    return choices
