"""The serving gate (`serve --max-kld X`): at load, the KL divergence of the weights the
engine will run from the same model in float32, on the packaged evaluation text (2 chunks
of 512 tokens, llama-perplexity's protocol), cached under ~/.cache/tokenmill/kld by the
model files' hash, the plan and the text, so a restart costs only the hash. Over the budget
the engine refuses to start and says why."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from tokenmill.cache_dirs import cache_root
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.model.models import build_model
from tokenmill.quant.plan import QuantPlan
from tokenmill.quant.texts import CALIBRATION_TEXT, EVALUATION_TEXT, read_text

logger = logging.getLogger(__name__)

GATE_CTX = 512
GATE_CHUNKS = 2
_CACHE_VERSION = "1"


class KLDBudgetExceeded(ValueError):
    pass


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)


def fingerprint(model_path: Path, plan: QuantPlan, kernels: dict | None = None) -> str:
    """The model files' content, the plan, the kernel settings in force (the activations'
    precision and the row limits change the numbers), the texts and the gate's protocol."""
    h = hashlib.sha256(_CACHE_VERSION.encode())
    files = (
        [model_path]
        if model_path.is_file()
        else sorted(
            p for p in model_path.iterdir() if p.suffix in (".gguf", ".safetensors", ".json")
        )
    )
    for path in files:
        h.update(path.name.encode())
        _hash_file(h, path)
    h.update(json.dumps(plan.to_dict(), sort_keys=True).encode())
    h.update(json.dumps(kernels or {}, sort_keys=True, default=str).encode())
    if plan.calibration is not None:
        _hash_file(h, CALIBRATION_TEXT if plan.calibration == "builtin" else Path(plan.calibration))
    _hash_file(h, EVALUATION_TEXT)
    h.update(f"{GATE_CTX}/{GATE_CHUNKS}".encode())
    return h.hexdigest()[:24]


def measure_engine_kld(
    model: str | None,
    model_path: Path,
    plan: QuantPlan,
    engine_model: LlamaForCausalLM,
    kernels: dict | None = None,
) -> dict:
    """The KLD report (dict) of `engine_model` (the plan's weights, already built, run with
    the kernel settings `kernels`) against the same model in float32; from the cache when
    this exact measurement was made before."""
    key = fingerprint(model_path, plan, kernels)
    cached = cache_root() / "kld" / f"{key}.json"
    if cached.exists():
        try:
            return json.loads(cached.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    from tokenmill.model.linear import get_linear_method
    from tokenmill.model.loader import load_model_files
    from tokenmill.quant.kld import eval_tokens, kld_report, make_chunks, score
    from tokenmill.quant.scoring import ModelScorer

    t0 = time.monotonic()
    same_as_reference = plan.scheme == "float32" and not plan.overrides
    files = load_model_files(model, with_weights=not same_as_reference)
    reference_model = engine_model
    if not same_as_reference:
        reference_model = build_model(
            files.arch,
            files.weights,
            GATE_CTX,
            get_linear_method("float32"),
            files.rope_freq_factors,
        )
    ids, bos = eval_tokens(files.tokenizer, read_text(None, EVALUATION_TEXT))
    chunks = make_chunks(ids, GATE_CTX, GATE_CHUNKS, bos)
    batch = len(chunks.chunks)
    reference = score(ModelScorer(reference_model, GATE_CTX, batch), chunks)
    del reference_model
    test = score(ModelScorer(engine_model, GATE_CTX, batch), chunks)
    report = kld_report(reference, test).to_dict()
    report["plan"] = plan.describe()
    report["seconds"] = round(time.monotonic() - t0, 2)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, cached)
    except OSError as e:
        logger.warning("KLD cache not written: %s", e)
    return report


def check_kld(report: dict, max_kld: float) -> None:
    if report["mean_kld"] > max_kld:
        raise KLDBudgetExceeded(
            f"weights {report['plan']}: mean KL divergence {report['mean_kld']:.5f} from "
            f"float32 (p99 {report['p99_kld']:.4f}, same top token {report['same_top_pct']:.1f}%, "
            f"{report['num_tokens']} tokens of the built-in text) exceeds --max-kld {max_kld}; "
            "choose a higher-precision --weights, a plan from `tokenmill quant search "
            f"--max-kld {max_kld}`, or a larger budget"
        )
