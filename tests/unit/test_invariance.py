"""Same greedy tokens however a request is batched, chunked or preempted; block accounting
checked after every engine step."""

from __future__ import annotations

import random

import pytest

from tokenmill import LLM, SamplingParams
from tokenmill.engine.core import EngineCore

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def mixed_prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(20, 40000) for _ in range(rng.randrange(1, 90))] for _ in range(n)]


def run_checked(
    llm: LLM, prompts: list[list[int]], params: SamplingParams = GREEDY
) -> list[list[int]]:
    """Drive the engine step by step, checking block accounting after each step."""
    engine = llm.engine
    ids = []
    for p in prompts:
        rid = engine.new_request_id()
        engine.add_request(rid, {"prompt_token_ids": p}, params)
        ids.append(rid)
    done = {}
    core: EngineCore = engine.core
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        core.check_invariants()
    assert core.kv_manager.num_free_blocks == core.num_blocks, (
        "blocks leaked after all requests finished"
    )
    return [done[r] for r in ids]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir):
    prompts = mixed_prompts(32)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, max_num_seqs=1)
    alone = [run_checked(llm, [p])[0] for p in prompts]
    return prompts, alone


def test_batch_of_32_matches_alone(tiny_llama_dir, reference):
    prompts, alone = reference
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, max_num_seqs=32)
    assert run_checked(llm, prompts) == alone


def test_chunked_prefill_matches_unchunked(tiny_llama_dir, reference):
    prompts, alone = reference
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, max_num_batched_tokens=16)
    assert run_checked(llm, prompts) == alone
    unchunked = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, enable_chunked_prefill=False)
    assert run_checked(unchunked, prompts) == alone


def test_prompt_share_per_step_matches_alone(tiny_llama_dir, reference):
    prompts, alone = reference
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, long_prefill_token_threshold=8)
    assert run_checked(llm, prompts) == alone


def test_short_prompt_runs_beside_a_long_one(tiny_llama_dir):
    """long_prefill_token_threshold: a prompt arriving during a long one's prefill is
    computed in the next step instead of after the long one's whole prefill."""
    split = {}
    for threshold in (0, 16):
        llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.1, max_num_batched_tokens=64,
                  long_prefill_token_threshold=threshold)  # fmt: skip
        engine, params = llm.engine, SamplingParams(max_tokens=2)
        engine.add_request("long", {"prompt_token_ids": list(range(100, 300))}, params)
        engine.step()
        engine.add_request("short", {"prompt_token_ids": [11, 12, 13]}, params)
        out = engine.core.scheduler.schedule()
        split[threshold] = {s.request.request_id: s.num_new_tokens for s in out.scheduled}
    assert split == {0: {"long": 64}, 16: {"long": 16, "short": 3}}


def test_preemption_matches_large_pool(tiny_llama_dir, reference):
    prompts, alone = reference
    # 16 blocks x 16 tokens: every request fits alone (<= 110 tokens), but 32 at once cannot.
    llm = LLM(str(tiny_llama_dir), num_kv_blocks=16, max_num_seqs=32)
    assert run_checked(llm, prompts) == alone
    assert llm.engine.core.scheduler.num_preemptions > 0


def test_priority_policy_serves_urgent_first(tiny_llama_dir):
    llm = LLM(
        str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_num_seqs=1, scheduling_policy="priority"
    )
    engine = llm.engine
    order = []
    for rid, prio in (("low", 5), ("high", 0), ("mid", 2)):
        engine.add_request(
            rid, {"prompt_token_ids": [7, 8, 9]}, SamplingParams(max_tokens=2), priority=prio
        )
    while engine.has_unfinished_requests():
        order += [o.request_id for o in engine.step() if o.finished]
    assert order == ["high", "mid", "low"]


def test_abort_frees_blocks_mid_generation(tiny_llama_dir):
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_num_batched_tokens=16)
    engine, core = llm.engine, llm.engine.core
    for i, p in enumerate(mixed_prompts(6, seed=3)):
        engine.add_request(
            f"r{i}", {"prompt_token_ids": p}, SamplingParams(max_tokens=50, ignore_eos=True)
        )
    for _ in range(3):
        engine.step()
    engine.abort_request("r0")  # running
    engine.abort_request("r5")  # possibly still waiting / mid-prefill
    core.check_invariants()
    while engine.has_unfinished_requests():
        engine.step()
        core.check_invariants()
    assert core.kv_manager.num_free_blocks == core.num_blocks


@pytest.mark.slow  # the default (native) weights' batch invariance stays in the default run
def test_int8_batch_of_32_matches_alone(tiny_llama_dir):
    """W8A8 stays batch-invariant: exact integer GEMMs (native kernel for few rows,
    torch._int_mm for many) and per-row activation scales."""
    prompts = mixed_prompts(32, seed=5)
    alone_llm = LLM(
        str(tiny_llama_dir), quantization="int8", kv_cache_memory_gib=0.1, max_num_seqs=1
    )
    alone = [run_checked(alone_llm, [p])[0] for p in prompts]
    batched = LLM(
        str(tiny_llama_dir), quantization="int8", kv_cache_memory_gib=0.1, max_num_seqs=32
    )
    assert run_checked(batched, prompts) == alone


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_pure_torch_fallback_matches_native_kernels(
    tiny_llama_dir, reference, monkeypatch, quantization
):
    """Machines without a C compiler run the pure-torch path: same tokens."""
    from tokenmill.kernels import ops

    prompts, _ = reference
    native = LLM(str(tiny_llama_dir), quantization=quantization, kv_cache_memory_gib=0.1)
    expected = run_checked(native, prompts[:8])
    monkeypatch.setattr(ops, "kernels_available", lambda: False)
    fallback = LLM(str(tiny_llama_dir), quantization=quantization, kv_cache_memory_gib=0.1)
    assert fallback.engine.core.runner.attn.name == "torch"
    assert run_checked(fallback, prompts[:8]) == expected
