"""Quantization made at load, plans, calibration and the KLD tools: formats against gguf's
reference quantizer, calibration folding exact in float and lowering the error where
activations have outlier channels, KLD figures against a direct computation, mixed plans,
`tokenmill quant eval|search` and the `--max-kld` gate."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch

from tests.tiny_models import make_hf_model, save_hf_folder
from tests.unit.test_model_parity import INT_DOT_BOUND
from tokenmill import LLM
from tokenmill.cli import main as cli_main
from tokenmill.engine.scoring import sequence_logits
from tokenmill.model.linear import FloatMethod, get_linear_method
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.model.loader import load_model_files
from tokenmill.model.packed import PackedWeight
from tokenmill.quant.calibration import calibrate, collect_activation_stats
from tokenmill.quant.fidelity import FidelityBench
from tokenmill.quant.formats import fake_quantize, quantize_weight
from tokenmill.quant.groups import all_groups, group_of, matches
from tokenmill.quant.kld import ScoredLogProbs, eval_tokens, kld_report, make_chunks
from tokenmill.quant.plan import QuantPlan, read_plan, write_plan
from tokenmill.quant.progress import Progress
from tokenmill.quant.scoring import ModelScorer
from tokenmill.quant.texts import CALIBRATION_TEXT, read_text
from tokenmill.quant.weights import apply_plan

PROMPT = list(range(100, 160))


# ---------------------------------------------------------------- formats and plans


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q4_1"])
def test_fake_quantizer_matches_the_reference_quantizer(fmt):
    torch.manual_seed(0)
    w = torch.randn(96, 256) * 0.05
    w[:, 7] *= 40  # an outlier column
    w[3] = 0.0  # an all-zero row (zero scale)
    packed = quantize_weight(w, fmt)
    assert isinstance(packed, PackedWeight) and packed.name.lower() == fmt
    assert torch.equal(fake_quantize(w, fmt), packed.dequantize())


def test_plan_validation_and_round_trip(tmp_path):
    plan = QuantPlan("q4_0", (("layers.0.*", "float32"), ("lm_head", "q8_0")), "builtin")
    assert plan.format_for("layers.0.attn_qkv") == "float32"
    assert plan.format_for("layers.1.mlp_down") == "q4_0"
    assert plan.format_for("lm_head") == "q8_0"
    # like llama-quantize, 4/5-bit plans keep the output layer 8-bit unless told otherwise
    assert QuantPlan("q4_0").format_for("lm_head") == "q8_0"
    assert QuantPlan("q4_0", (("lm_head", "q4_0"),)).format_for("lm_head") == "q4_0"
    assert QuantPlan("int8").format_for("lm_head") == "int8"
    assert plan.method == "native"
    plan = QuantPlan(plan.scheme, plan.overrides, plan.calibration, outlier_channels=8)
    write_plan(tmp_path / "plan.json", plan, {"mean_kld": 0.01})
    again, measured = read_plan(tmp_path / "plan.json")
    assert again == plan and measured == {"mean_kld": 0.01}
    assert QuantPlan("int8").method == "int8"
    assert QuantPlan("int8", (("lm_head", "float32"),)).method == "native"
    for bad in (
        dict(scheme="fp4"),
        dict(scheme="bfloat16", overrides=(("lm_head", "q8_0"),)),
        dict(scheme="q4_0", overrides=(("lm_head", "q3_k"),)),
        dict(scheme="q4_0", overrides=(("", "q8_0"),)),
        dict(scheme="native", calibration="builtin"),
        dict(scheme="float32", calibration="builtin"),
        dict(scheme="q4_0", calibration=str(tmp_path / "missing.txt")),
        dict(scheme="q4_0", outlier_channels=4),  # chosen by calibration: needs one
        dict(scheme="int8", calibration="builtin", outlier_channels=4),  # packed formats only
        dict(scheme="q4_0", calibration="builtin", outlier_channels=1000),
    ):
        with pytest.raises(ValueError):
            QuantPlan(**bad)
    for text in ("{", "[]", '{"version": 9}', '{"version": 1, "overrides": [["a"]]}'):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(ValueError, match="quant plan"):
            read_plan(tmp_path / "bad.json")


def test_groups():
    assert group_of("model.layers.3.self_attn.k_proj.weight", False) == "layers.3.attn_qkv"
    assert group_of("model.layers.3.mlp.up_proj.weight", False) == "layers.3.mlp_gate_up"
    assert group_of("model.layers.3.input_layernorm.weight", False) is None
    assert group_of("model.embed_tokens.weight", False) is None
    assert group_of("model.embed_tokens.weight", True) == "lm_head"
    assert group_of("lm_head.weight", False) == "lm_head"
    assert len(all_groups(2)) == 9
    assert matches("layers.12.mlp_down", "layers.*.mlp_down")
    assert not matches("layers.12.mlp_down", "layers.1.*")


def test_config_rejects_conflicting_weight_choices(tmp_path):
    from tokenmill.config import ModelConfig

    plan = tmp_path / "p.json"
    write_plan(plan, QuantPlan("q8_0"))
    assert ModelConfig(quant_plan=str(plan)).weight_format == "q8_0"
    with pytest.raises(ValueError, match="quant_plan"):
        ModelConfig(quant_plan=str(plan), weights="q4_0")
    with pytest.raises(ValueError, match="max_kld"):
        ModelConfig(max_kld=-1.0)
    with pytest.raises(ValueError, match="calibration"):
        ModelConfig(weights="float32", calibration="builtin")


# ---------------------------------------------------------------- models made at load


def _float_reference(path, weights_of):
    """A float32 model whose linear weights are `weights_of(name, float weight)`."""
    files = load_model_files(str(path))
    for name, w in list(files.weights.items()):
        files.weights[name] = weights_of(name, w)
    return LlamaForCausalLM(files.arch, files.weights, 256, FloatMethod())


def _logits(model, ids):
    return ModelScorer(model, len(ids)).log_probs([ids])[0]


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_safetensors_quantized_at_load_match_the_dequantized_weights(tiny_llama_dir, fmt):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, weights=fmt)
    model = llm.engine.core.model
    assert type(model.layers[0].qkv_proj).__name__ == "PackedLinear"
    assert type(model.lm_head).__name__ == "PackedLinear"

    plan = QuantPlan(fmt)

    def dequantized(name, w):
        group = group_of(name, False)
        return fake_quantize(w, plan.format_for(group)) if group else w

    reference = _float_reference(tiny_llama_dir, dequantized)
    ours = sequence_logits(llm.engine.core, PROMPT).log_softmax(-1)
    # the integer-dot kernels' activation bits (test_model_parity.INT_DOT_BOUND); within 1e-3
    bound = max(INT_DOT_BOUND, 1e-3)
    assert (ours - _logits(reference, PROMPT)).abs().max().item() <= bound


def test_mixed_plan_runs_each_group_in_its_format(tiny_llama_dir):
    plan = QuantPlan(
        "q4_0",
        (("layers.0.*", "float32"), ("layers.1.attn_o", "int8"), ("lm_head", "q8_0")),
    )
    files = load_model_files(str(tiny_llama_dir))
    apply_plan(files, plan)
    model = LlamaForCausalLM(files.arch, files.weights, 256, get_linear_method(plan.method))
    model.method.choose_row_kernels()  # the engine's row kernels for the prompt's rows
    kinds = {
        "l0.qkv": type(model.layers[0].qkv_proj).__name__,
        "l1.qkv": type(model.layers[1].qkv_proj).__name__,
        "l1.o": type(model.layers[1].o_proj).__name__,
        "lm_head": type(model.lm_head).__name__,
    }
    assert kinds == {
        "l0.qkv": "FloatLinear",
        "l1.qkv": "PackedLinear",
        "l1.o": "Int8ActivationLinear",
        "lm_head": "PackedLinear",
    }
    assert model.lm_head.weight.name == "Q8_0"
    # the same plan through the engine
    path = tiny_llama_dir.parent / "mixed-plan.json"
    write_plan(path, plan)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, quant_plan=str(path))
    engine_lp = sequence_logits(llm.engine.core, PROMPT).log_softmax(-1)
    assert (engine_lp - _logits(model, PROMPT)).abs().max().item() <= 1e-4


# ---------------------------------------------------------------- calibration


@pytest.fixture(scope="module")
def outlier_model_dir(tmp_path_factory):
    """The tiny model with a few activation channels 30x larger, compensated in the weights
    that read them (the float function is unchanged): what real LLMs look like to a
    quantizer, and what calibration is for."""
    model = make_hf_model("llama", hidden_size=128, intermediate_size=256)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm, projections in (
                (layer.input_layernorm, [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]),
                (layer.post_attention_layernorm, [layer.mlp.gate_proj, layer.mlp.up_proj]),
            ):  # fmt: skip
                for channel in (5, 77):
                    norm.weight[channel] *= 30.0
                    for proj in projections:
                        proj.weight[:, channel] /= 30.0
    return save_hf_folder(model, tmp_path_factory.mktemp("tiny-outliers"))


def test_calibration_folds_exactly_in_float(outlier_model_dir):
    files = load_model_files(str(outlier_model_dir))
    original = dict(files.weights)
    ids, bos = eval_tokens(files.tokenizer, read_text(None, CALIBRATION_TEXT))
    stats = collect_activation_stats(files.arch, files.weights, ids[:600], bos)
    assert set(stats) == set(all_groups(files.arch.num_hidden_layers)) - {"lm_head"}
    choices = calibrate(files.arch, files.weights, stats, lambda group: "q4_0")
    assert sum(c.scale is not None for c in choices.values()) >= 4
    assert all(c.error_after <= c.error_before for c in choices.values())
    calibrated = LlamaForCausalLM(files.arch, files.weights, 256, FloatMethod())
    plain = LlamaForCausalLM(files.arch, original, 256, FloatMethod())
    diff = (_logits(calibrated, PROMPT) - _logits(plain, PROMPT)).abs().max().item()
    assert diff <= 1e-3


@pytest.mark.parametrize("scheme", ["q4_0", "int8"])
def test_calibration_lowers_the_kld_where_activations_have_outliers(outlier_model_dir, scheme):
    bench = FidelityBench(str(outlier_model_dir), ctx=128, max_chunks=3)
    plain = bench.measure(QuantPlan(scheme))
    calibrated = bench.measure(QuantPlan(scheme, calibration="builtin"))
    assert plain.mean_kld > 0
    assert calibrated.mean_kld < 0.7 * plain.mean_kld, (plain.mean_kld, calibrated.mean_kld)


def test_outlier_channels_run_in_float32_beside_the_packed_weight():
    from tokenmill.model.linear import NativeMethod
    from tokenmill.model.packed import OutlierSplit, cat_rows
    from tokenmill.quant.weights import split_outliers

    torch.manual_seed(0)
    q, k = torch.randn(64, 96), torch.randn(32, 96)
    q[:, 10] *= 50
    channels = torch.tensor([10, 40])
    parts = [split_outliers(w, channels, "q4_0") for w in (q, k)]
    assert all(torch.equal(p.dense, w[:, channels]) for p, w in zip(parts, (q, k), strict=True))
    fused = cat_rows(parts)
    assert isinstance(fused, OutlierSplit) and fused.shape == (96, 96)
    weight = fused.dequantize()
    assert torch.equal(weight[:, channels], torch.cat([q, k])[:, channels])
    rest = [c for c in range(96) if c not in (10, 40)]
    plain = fake_quantize(torch.cat([q, k]), "q4_0")
    # the outlier column no longer sets its blocks' scales: the rest is closer to float
    err_split = (weight[:, rest] - torch.cat([q, k])[:, rest]).abs().mean()
    err_plain = (plain[:, rest] - torch.cat([q, k])[:, rest]).abs().mean()
    assert err_split < 0.8 * err_plain
    x = torch.randn(5, 96)
    linear = NativeMethod().linear(fused)
    assert type(linear).__name__ == "OutlierLinear"
    residual = torch.randn(5, 96)
    expected = residual + x @ weight.t()
    # the packed part's integer-dot kernels round activations to the default bits (outputs up
    # to ~180; measured 6.1e-5 at 24 bits, 6.2e-4 at 16)
    assert torch.allclose(linear(x, residual.clone()), expected, atol=INT_DOT_BOUND)


def test_outlier_channels_lower_the_kld_further(outlier_model_dir):
    bench = FidelityBench(str(outlier_model_dir), ctx=128, max_chunks=3)
    calibrated = bench.measure(QuantPlan("q4_0", calibration="builtin"))
    with_outliers = bench.measure(QuantPlan("q4_0", calibration="builtin", outlier_channels=2))
    assert with_outliers.mean_kld < calibrated.mean_kld, (
        calibrated.mean_kld,
        with_outliers.mean_kld,
    )


# ---------------------------------------------------------------- KLD figures


def test_kld_report_against_a_direct_computation():
    torch.manual_seed(0)
    ref_logits = torch.randn(300, 50) * 3
    test_logits = ref_logits + torch.randn(300, 50) * 0.3
    targets = torch.randint(0, 50, (300,))
    ref = ScoredLogProbs(ref_logits.log_softmax(-1), targets)
    test = ScoredLogProbs(test_logits.log_softmax(-1), targets)
    report = kld_report(ref, test)
    direct = torch.nn.functional.kl_div(
        test.log_probs, ref.log_probs, log_target=True, reduction="none"
    ).sum(-1)
    assert report.mean_kld == pytest.approx(direct.mean().item(), rel=1e-5)
    assert report.p99_kld == pytest.approx(np.quantile(direct.numpy(), 0.99), rel=1e-4)
    assert report.max_kld == pytest.approx(direct.max().item(), rel=1e-5)
    same = (ref_logits.argmax(-1) == test_logits.argmax(-1)).float().mean().item()
    assert report.same_top_pct == pytest.approx(100 * same)
    nll = torch.nn.functional.cross_entropy(ref_logits, targets).item()
    assert report.ppl_ref == pytest.approx(np.exp(nll), rel=1e-5)
    identical = kld_report(ref, ref)
    assert identical.mean_kld == 0 and identical.same_top_pct == 100 and identical.rms_dp_pct == 0


def test_chunks_follow_llama_perplexity():
    chunks = make_chunks(list(range(10, 110)), ctx=32, max_chunks=None, bos_token_id=1)
    assert len(chunks.chunks) == 3 and all(c[0] == 1 for c in chunks.chunks)
    assert chunks.chunks[1][1:] == list(range(43, 74))
    assert chunks.first == 16 and chunks.num_scored == 3 * 15
    with pytest.raises(ValueError, match="fewer than one chunk"):
        make_chunks([1, 2, 3], ctx=32, max_chunks=None, bos_token_id=None)


def test_scorer_matches_the_engine_path(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
    files = load_model_files(str(tiny_llama_dir))
    model = LlamaForCausalLM(files.arch, files.weights, 256, FloatMethod())
    other = list(range(300, 340))
    batched = ModelScorer(model, len(PROMPT), 2).log_probs([PROMPT, other])
    for ids, ours in zip([PROMPT, other], batched, strict=True):
        engine = sequence_logits(llm.engine.core, ids).log_softmax(-1)
        assert (ours - engine).abs().max().item() <= 1e-4


# ---------------------------------------------------------------- tools and the gate


def test_quant_eval_reports_calibration_side_by_side(outlier_model_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    code = cli_main([
        "quant", "eval", "--model", str(outlier_model_dir), "--scheme", "q4_0",
        "--calibration", "builtin", "--ctx", "128", "--chunks", "2", "--json", str(out),
    ])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "Mean    KLD" in text and "Same top p" in text and "sensitivity" in text
    steps = [line.split("s] ", 1)[1] for line in captured.err.splitlines() if "s] " in line]
    assert steps[:4] == [
        f"loading {outlier_model_dir}",
        "scoring the float32 reference (2 chunks scored)",
        "measuring q4_0 (2 chunks scored)",
        "calibrating for q4_0, calibrated on builtin (2 layers)",
    ], captured.err
    assert "measuring float32, layers.1.*=q4_0 (2 chunks scored)" in steps  # sensitivity
    figures = json.loads(out.read_text())
    assert figures["q4_0"]["mean_kld"] > figures["q4_0, calibrated on builtin"]["mean_kld"]
    assert set(figures["sensitivity"]) == {
        "layers.*.attn_qkv", "layers.*.attn_o", "layers.*.mlp_gate_up", "layers.*.mlp_down",
        "layers.0.*", "layers.1.*", "lm_head",
    }  # fmt: skip


def test_progress_lines_are_at_most_one_a_second_but_for_new_steps():
    clock, out = [100.0], io.StringIO()
    progress = Progress(out, interval_s=1.0, clock=lambda: clock[0])
    progress.begin("measuring q4_0", 8, "chunks scored")
    for _ in range(3):  # quick batches: no line
        clock[0] += 0.3
        progress.advance(2)
    clock[0] += 0.3
    progress.advance(2)
    progress.begin("calibrating", 2, "layers")
    assert out.getvalue().splitlines() == [
        "[    0.0s] measuring q4_0 (8 chunks scored)",
        "[    1.2s] measuring q4_0: 8/8 chunks scored",
        "[    1.2s] calibrating (2 layers)",
    ]
    quiet = Progress(out, enabled=False)
    quiet.begin("x")
    assert len(out.getvalue().splitlines()) == 3


def test_quant_search_meets_the_budget_and_serve_loads_the_plan(outlier_model_dir, tmp_path):
    bench = FidelityBench(str(outlier_model_dir), ctx=128, max_chunks=2)
    base = bench.measure(QuantPlan("q4_0")).mean_kld
    budget = base / 3
    plan_path = tmp_path / "plan.json"
    code = cli_main([
        "quant", "search", "--model", str(outlier_model_dir), "--scheme", "q4_0",
        "--max-kld", f"{budget}", "--ctx", "128", "--chunks", "2", "--output", str(plan_path),
    ])  # fmt: skip
    assert code == 0
    plan, measured = read_plan(plan_path)
    assert plan.overrides and measured["mean_kld"] <= budget
    assert bench.measure(plan).mean_kld == pytest.approx(measured["mean_kld"], rel=1e-4)
    llm = LLM(str(outlier_model_dir), kv_cache_memory_gib=0.05, quant_plan=str(plan_path))
    assert llm.engine.core.config.model_config.plan == plan
    # an impossible budget: no plan, exit status 1
    assert (
        cli_main(
            [
                "quant",
                "search",
                "--model",
                str(outlier_model_dir),
                "--scheme",
                "q4_0",
                "--max-kld",
                "0",
                "--keep",
                "q8_0",
                "--ctx",
                "128",
                "--chunks",
                "1",
                "--output",
                str(tmp_path / "none.json"),
            ]
        )  # fmt: skip
        == 1
    )
    assert not (tmp_path / "none.json").exists()


def test_max_kld_gate_refuses_over_budget_and_caches(tiny_llama_dir, tmp_path, monkeypatch):
    from tokenmill.quant.gate import KLDBudgetExceeded

    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    with pytest.raises(KLDBudgetExceeded, match="exceeds --max-kld 1e-09"):
        LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, weights="q4_0", max_kld=1e-9)
    cached = list((tmp_path / "kld").glob("*.json"))
    assert len(cached) == 1
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, weights="q4_0", max_kld=10.0)
    report = llm.engine.core.weights_kld
    assert report == json.loads(cached[0].read_text())
    assert 0 < report["mean_kld"] < 10 and report["plan"] == "q4_0"
    exact = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_kld=0.0)
    assert exact.engine.core.weights_kld["mean_kld"] == 0.0
    # the same weights with 8-bit activations are measured again, not read from the 24-bit
    # measurement's cache (which would let them through a budget they exceed)
    a8 = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, weights="q4_0", max_kld=10.0,
             int_dot_activation_bits=8)  # fmt: skip
    assert len(list((tmp_path / "kld").glob("*.json"))) == 3
    assert a8.engine.core.weights_kld["mean_kld"] != report["mean_kld"]
