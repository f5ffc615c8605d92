"""Tokens per expert: counted by each MoE layer, reported in the engine's stats and on
/metrics as a counter per layer and expert plus each layer's imbalance."""

from __future__ import annotations

from prometheus_client import generate_latest

from tests.family_models import make_family_model
from tests.tiny_models import save_hf_folder
from tokenmill import LLM, SamplingParams
from tokenmill.server.metrics import ServerMetrics
from tokenmill.stats import SchedulerStats


def test_engine_counts_every_routed_token(tmp_path):
    model = make_family_model("qwen3_moe")  # layer 1 is dense: two MoE layers of 4 experts
    llm = LLM(str(save_hf_folder(model, tmp_path / "moe")), kv_cache_memory_gib=0.05)
    core = llm.engine.core
    before = core.stats().expert_load  # the warm-up request's tokens
    assert len(before) == 2 and all(len(layer) == 4 for layer in before)
    prompt = list(range(100, 120))
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=5, ignore_eos=True))
    load = core.stats().expert_load
    tokens = len(prompt) + 4  # the last sampled token is never run through the model
    top_k = model.config.num_experts_per_tok
    assert [sum(a) - sum(b) for a, b in zip(load, before, strict=True)] == [tokens * top_k] * 2


def test_metrics_expose_tokens_per_expert_and_imbalance():
    metrics = ServerMetrics("moe")
    metrics.on_scheduler_stats(SchedulerStats(expert_load=[[3, 1, 0, 0]]))
    metrics.on_scheduler_stats(SchedulerStats(expert_load=[[5, 1, 2, 0]]))
    text = generate_latest(metrics.registry).decode()
    assert 'tokenmill:moe_expert_tokens_total{expert="0",layer="0",model_name="moe"} 5.0' in text
    assert 'tokenmill:moe_expert_tokens_total{expert="2",layer="0",model_name="moe"} 2.0' in text
    assert 'tokenmill:moe_expert_load_imbalance{layer="0",model_name="moe"} 2.5' in text
