"""`tokenmill quant search`: which layer groups to keep in higher precision so the model
stays under a KL-divergence budget at the best measured speed.

Greedy on measurements, not on a model of them: each layer (all its groups) and the output
layer is kept in the higher format one at a time to measure what it buys (KLD drop per
byte added); layers are then promoted in that order, re-measuring the whole model after
each step (errors interact and can cancel, so sums of single-layer figures mislead), until
the budget holds. This runs for each candidate higher format; the plans that meet the
budget are timed (single-stream decode) and the fastest is written."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from tokenmill.quant.fidelity import FidelityBench
from tokenmill.quant.kld import KLDReport
from tokenmill.quant.plan import QuantPlan

logger = logging.getLogger(__name__)


@dataclass
class Candidate:
    plan: QuantPlan
    report: KLDReport
    weight_bytes: float
    decode_tok_s: float | None = None


@dataclass
class SearchResult:
    base: Candidate
    best: Candidate | None
    tried: list[Candidate] = field(default_factory=list)
    # (unit, format, KLD with only that unit kept in the format)
    sensitivity: list[tuple[str, str, float]] = field(default_factory=list)


def search_units(num_layers: int) -> list[str]:
    return [f"layers.{i}.*" for i in range(num_layers)] + ["lm_head"]


def search(
    bench: FidelityBench,
    scheme: str,
    max_kld: float,
    keep_formats: tuple[str, ...] = ("q8_0", "float32"),
    calibration: str | None = None,
    speed_steps: int = 48,
    outlier_channels: int = 0,
) -> SearchResult:
    base_plan = QuantPlan(scheme, calibration=calibration, outlier_channels=outlier_channels)
    calibrated = bench.calibrated_weights(base_plan) if calibration else None
    base_report = bench.measure(base_plan, calibrated)
    base = Candidate(base_plan, base_report, bench.weight_bytes(base_plan))
    logger.info("%s: mean KLD %.5f", base_plan.describe(), base_report.mean_kld)
    result = SearchResult(base, None)
    if base_report.mean_kld <= max_kld:
        result.tried.append(base)
    else:
        for keep in keep_formats:
            candidate = _promote(bench, base, keep, max_kld, calibrated, result)
            if candidate is not None:
                result.tried.append(candidate)
    for candidate in result.tried:
        candidate.decode_tok_s = bench.decode_speed(candidate.plan, speed_steps, calibrated)
        logger.info(
            "%s: KLD %.5f, %.1f tok/s",
            candidate.plan.describe(),
            candidate.report.mean_kld,
            candidate.decode_tok_s,
        )
    if result.tried:
        result.best = max(result.tried, key=lambda c: c.decode_tok_s or 0.0)
    return result


def _promote(
    bench: FidelityBench,
    base: Candidate,
    keep: str,
    max_kld: float,
    calibrated,
    result: SearchResult,
) -> Candidate | None:
    scheme = base.plan.scheme
    if keep == scheme:
        return None
    gains = []
    for unit in search_units(bench.num_layers):
        plan = dataclasses.replace(base.plan, overrides=((unit, keep),))
        kld = bench.measure(plan, calibrated).mean_kld
        result.sensitivity.append((unit, keep, kld))
        added = bench.weight_bytes(plan) - base.weight_bytes
        gains.append(((base.report.mean_kld - kld) / max(added, 1.0), unit))
    gains.sort(reverse=True)
    kept: list[str] = []
    for gain, unit in gains:
        if gain <= 0:
            break
        kept.append(unit)
        plan = dataclasses.replace(base.plan, overrides=tuple((u, keep) for u in kept))
        report = bench.measure(plan, calibrated)
        logger.info("keep %s in %s: KLD %.5f", "+".join(kept), keep, report.mean_kld)
        if report.mean_kld <= max_kld:
            return Candidate(plan, report, bench.weight_bytes(plan))
    return None
