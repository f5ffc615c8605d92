"""Measures quantization plans on one model against its float32 reference: the reference
is scored once, then each plan is built from the same loaded weights (no reload) and
compared (kld.py), optionally timed (single-stream decode)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import torch

from tokenmill.model.linear import get_linear_method
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.model.loader import load_model_files
from tokenmill.model.model_files import ModelFiles
from tokenmill.model.models import build_model
from tokenmill.quant.groups import linear_groups
from tokenmill.quant.kld import (
    KLDReport,
    ScoredLogProbs,
    eval_tokens,
    kld_report,
    make_chunks,
    score,
)
from tokenmill.quant.plan import QuantPlan
from tokenmill.quant.progress import Progress
from tokenmill.quant.schemes import BITS_PER_WEIGHT
from tokenmill.quant.scoring import ModelScorer
from tokenmill.quant.texts import EVALUATION_TEXT, read_text
from tokenmill.quant.weights import apply_plan

logger = logging.getLogger(__name__)

_SPEED_PROMPT = 16


def _with_row_kernels(model: LlamaForCausalLM, method) -> LlamaForCausalLM:
    """The model with the row kernels its engine would run (the native method's integer-dot
    row limit, measured or stored for this machine, or set by the kernel switches), so a
    prompt's rows run the kernels (and activation precision) a served prompt does."""
    choose = getattr(method, "choose_row_kernels", None)
    if choose is not None and method.native:
        choose()
    return model


@dataclass
class Calibrated:
    """Weights calibrated once for a plan, reused by every plan measured on them."""

    plan: QuantPlan
    weights: dict
    outliers: dict[str, torch.Tensor]


class FidelityBench:
    def __init__(
        self,
        model: str | None,
        text: str | None = None,
        ctx: int = 512,
        max_chunks: int | None = 8,
        batch: int = 2,
        progress: Progress | None = None,
    ) -> None:
        self.progress = progress if progress is not None else Progress(enabled=False)
        self.model_path = model
        self.progress.begin(f"loading {model or 'the embedded model'}")
        self.float_files = load_model_files(model, packed=False)
        self._packed_files: ModelFiles | None = None
        self._caches: dict[int, dict] = {}  # converted weights, per base weights dict
        ids, bos = eval_tokens(self.float_files.tokenizer, read_text(text, EVALUATION_TEXT))
        self.chunks = make_chunks(ids, ctx, max_chunks, bos)
        self.batch = min(batch, len(self.chunks.chunks))
        self._speed_prompt = ids[:_SPEED_PROMPT]
        t0 = time.monotonic()
        self._begin_scoring("scoring the float32 reference")
        self.reference: ScoredLogProbs = self.score(self.build(QuantPlan("float32")))
        logger.info(
            "reference scored: %d tokens in %.1fs", self.chunks.num_scored, time.monotonic() - t0
        )

    @property
    def num_layers(self) -> int:
        return self.float_files.arch.num_hidden_layers

    def files_for(self, plan: QuantPlan, calibrated: Calibrated | None = None) -> ModelFiles:
        """A copy of the loaded model's files with weights prepared for `plan`; `calibrated`:
        weights already calibrated for it (skips calibrating again)."""
        base = self._packed() if plan.loads_packed else self.float_files
        base_weights = calibrated.weights if calibrated is not None else base.weights
        files = dataclasses.replace(base, weights=dict(base_weights))
        outliers = None
        if calibrated is not None:
            plan = dataclasses.replace(plan, calibration=None, outlier_channels=0)
            outliers = calibrated.outliers if calibrated.plan.outlier_channels else None
        cache = None if plan.calibration else self._caches.setdefault(id(base_weights), {})
        apply_plan(files, plan, cache, outliers)
        return files

    def calibrated_weights(self, plan: QuantPlan) -> Calibrated:
        """Float weights with `plan`'s calibration scales folded in (not yet quantized)."""
        from tokenmill.quant.weights import calibrate_weights

        files = dataclasses.replace(self.float_files, weights=dict(self.float_files.weights))
        self.progress.begin(f"calibrating for {plan.describe()}", self.num_layers, "layers")
        outliers = calibrate_weights(files, plan, self.progress.advance)
        return Calibrated(plan, files.weights, outliers)

    def build(self, plan: QuantPlan, calibrated: Calibrated | None = None) -> LlamaForCausalLM:
        files = self.files_for(plan, calibrated)
        method = get_linear_method(plan.method)
        model = build_model(
            files.arch, files.weights, self.chunks.ctx, method, files.rope_freq_factors
        )
        return _with_row_kernels(model, method)

    def _begin_scoring(self, label: str) -> None:
        self.progress.begin(label, len(self.chunks.chunks), "chunks scored")

    def score(self, model: LlamaForCausalLM) -> ScoredLogProbs:
        scorer = ModelScorer(model, self.chunks.ctx, self.batch)
        return score(scorer, self.chunks, self.batch, self.progress.advance)

    def measure(self, plan: QuantPlan, calibrated: Calibrated | None = None) -> KLDReport:
        self._begin_scoring(f"measuring {plan.describe()}")
        return kld_report(self.reference, self.score(self.build(plan, calibrated)))

    def measure_file(self, path: str, plan: QuantPlan) -> KLDReport:
        """Another file of the same model (another conversion of its weights) under `plan`,
        against this bench's float32 reference."""
        from tokenmill.quant.weights import load_for_plan

        self._begin_scoring(f"measuring {path} ({plan.describe()})")
        files = load_for_plan(path, plan)
        if files.arch.vocab_size != self.float_files.arch.vocab_size:
            raise ValueError(f"{path}: not a conversion of {self.float_files.name}")
        method = get_linear_method(plan.method)
        model = build_model(
            files.arch, files.weights, self.chunks.ctx, method, files.rope_freq_factors
        )
        return kld_report(self.reference, self.score(_with_row_kernels(model, method)))

    def decode_speed(
        self, plan: QuantPlan, steps: int = 64, calibrated: Calibrated | None = None
    ) -> float:
        self.progress.begin(f"timing decode: {plan.describe()}")
        model = self.build(plan, calibrated)
        scorer = ModelScorer(model, _SPEED_PROMPT + steps + 1)
        scorer.decode_speed(self._speed_prompt, 8)  # warm-up
        return scorer.decode_speed(self._speed_prompt, steps)

    def weight_bytes(self, plan: QuantPlan) -> float:
        """Bytes of the linear layers' weights under `plan` (what decode reads per token)."""
        files = self.float_files
        total = 0.0
        for name, group in linear_groups(files.weights, files.arch.tie_word_embeddings).items():
            fmt = plan.format_for(group)
            numel = torch.Size(files.weights[name].shape).numel()
            if fmt == "native":  # the file's own bytes (4 per value where it stores floats)
                total += getattr(self._packed().weights[name], "nbytes", 4 * numel)
            else:
                total += numel * BITS_PER_WEIGHT.get(fmt, 32.0) / 8
        return total

    def _packed(self) -> ModelFiles:
        """The model's files with the file's packed blocks kept (loaded on first use)."""
        if self._packed_files is None:
            self._packed_files = load_model_files(self.model_path, packed=True)
        return self._packed_files
