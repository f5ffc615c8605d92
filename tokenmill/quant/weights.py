"""Turns a model's weights into what a quantization plan runs: the file's packed blocks kept
(native), float weights, or GGUF blocks made at load — per group, after calibration when
the plan asks for it. The engine and the fidelity tools build their models through here."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from tokenmill.model.device_method import device_method
from tokenmill.model.loader import load_model_files
from tokenmill.model.model_files import ModelFiles
from tokenmill.model.packed import Int8Weight, OutlierSplit, PackedWeight, as_float
from tokenmill.model.prefetch import WeightPrefetch
from tokenmill.quant.groups import linear_groups
from tokenmill.quant.plan import QuantPlan
from tokenmill.quant.schemes import AT_LOAD_FORMATS, CALIBRATED_SCHEMES

logger = logging.getLogger(__name__)


def load_for_plan(
    model: str | None,
    plan: QuantPlan,
    prefetch: WeightPrefetch | None = None,
    load_format: str = "auto",
    device: str = "cpu",
) -> ModelFiles:
    """The model's files with weights prepared for `plan` (see apply_plan). On a GPU the
    weights stay float (the device's method converts them there); dummy weights are made
    on the device in its dtype."""
    if device != "cpu":
        dtype = device_method(plan.scheme, device).dtype  # what the device's method runs
        return load_model_files(model, load_format=load_format, device=device, dtype=dtype)
    files = load_model_files(
        model, packed=plan.loads_packed, prefetch=prefetch, load_format=load_format
    )
    apply_plan(files, plan)
    return files


def apply_plan(
    files: ModelFiles,
    plan: QuantPlan,
    cache: dict | None = None,
    outliers: dict[str, torch.Tensor] | None = None,
) -> None:
    """Rewrites files.weights in place for `plan`: each linear layer's matrix becomes the
    format its group gets (packed blocks or float32); the rest stays as loaded. `cache`
    keeps converted weights by (name, format) for callers that build many plans from the
    same loaded weights; `outliers`: channels per group from an earlier calibration of
    these weights (else the plan's own calibration chooses them)."""
    t0 = time.monotonic()
    weights = files.weights
    if plan.calibration is not None:
        outliers = calibrate_weights(files, plan)
    for name, group in linear_groups(weights, files.arch.tie_word_embeddings).items():
        fmt = plan.format_for(group)
        channels = outliers.get(group) if outliers and fmt in AT_LOAD_FORMATS else None
        key = (name, fmt, plan.method, channels is not None)
        if cache is not None and key in cache:
            weights[name] = cache[key]
            continue
        if channels is not None:
            weights[name] = split_outliers(as_float(weights[name]), channels, fmt)
        else:
            weights[name] = convert(weights[name], fmt, plan.method)
        if cache is not None:
            cache[key] = weights[name]
    if plan.scheme != "float32" or plan.overrides:
        logger.info("weights prepared for %s in %.1fs", plan.describe(), time.monotonic() - t0)


def split_outliers(weight: torch.Tensor, channels: torch.Tensor, fmt: str) -> OutlierSplit:
    from tokenmill.quant.formats import quantize_weight

    dense = weight[:, channels].clone()
    main = weight.clone()
    main[:, channels] = 0.0
    return OutlierSplit(quantize_weight(main, fmt), channels, dense)


def convert(
    weight: torch.Tensor | PackedWeight, fmt: str, method: str
) -> torch.Tensor | PackedWeight | Int8Weight:
    """One weight in `fmt` for the linear `method`: "native" keeps what the file stores; a
    GGUF format name quantizes into its blocks; int8 in a mixed plan is marked for the
    native method to quantize; otherwise float (the int8 / bfloat16 methods quantize)."""
    if fmt == "native":
        return weight
    if fmt == "int8" and method == "native":
        return Int8Weight(as_float(weight))
    if fmt in AT_LOAD_FORMATS:
        from tokenmill.quant.formats import quantize_weight

        if isinstance(weight, PackedWeight) and weight.name.lower() == fmt:
            return weight
        return quantize_weight(as_float(weight), fmt)
    return as_float(weight)


def calibrate_weights(
    files: ModelFiles, plan: QuantPlan, on_layer: Callable[[], None] | None = None
) -> dict[str, torch.Tensor]:
    """Folds the plan's calibration scales into files.weights (made float) and returns the
    outlier channels per group (empty unless the plan keeps some); `on_layer()` after each
    layer's scales are chosen (progress)."""
    from tokenmill.quant.calibration import (
        calibrate,
        collect_activation_stats,
        select_outlier_channels,
    )
    from tokenmill.quant.kld import eval_tokens
    from tokenmill.quant.texts import CALIBRATION_TEXT, read_text

    t0 = time.monotonic()
    weights = files.weights
    for name, value in weights.items():
        if isinstance(value, PackedWeight):
            weights[name] = value.dequantize()
    ids, bos = eval_tokens(files.tokenizer, read_text(plan.calibration, CALIBRATION_TEXT))
    stats = collect_activation_stats(files.arch, weights, ids, bos)
    # Scales are searched for the plan's scheme in every group, also those a plan keeps in
    # higher precision (exact there): a plan then serves the weights its search measured.
    if plan.scheme in CALIBRATED_SCHEMES:
        choices = calibrate(files.arch, weights, stats, lambda group: plan.scheme, on_layer)
    else:
        choices = calibrate(files.arch, weights, stats, plan.format_for, on_layer)
    outliers = {}
    if plan.outlier_channels:
        outliers = select_outlier_channels(
            files.arch, weights, stats, choices, plan.outlier_channels
        )
    scaled = [c for c in choices.values() if c.scale is not None]
    gain = sum(c.error_before for c in choices.values()) / max(
        1e-30, sum(c.error_after for c in choices.values())
    )
    logger.info(
        "calibrated on %d tokens: %d of %d groups rescaled, layer output error %.2fx lower, %.1fs",
        max(s.count for s in stats.values()),
        len(scaled),
        len(choices),
        gain,
        time.monotonic() - t0,
    )
    return outliers
