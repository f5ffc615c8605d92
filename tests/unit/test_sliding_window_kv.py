"""Sliding-window models give back the KV blocks that fall out of every layer's window: the
pool's accounting stays exact, and the model's logits and tokens stay transformers' (the
freed blocks' keys were masked anyway)."""

from __future__ import annotations

import torch

from tests.tiny_models import make_hf_model, save_hf_folder
from tests.unit.test_model_parity import hf_greedy
from tokenmill import LLM, SamplingParams
from tokenmill.engine.scoring import sequence_logits
from tokenmill.kv.manager import KVCacheManager
from tokenmill.request import Request


def test_blocks_out_of_the_window_are_freed():
    kv = KVCacheManager(32, 4, enable_caching=True, sliding_window=6)
    req = Request("r", list(range(100, 140)), SamplingParams(max_tokens=8), [], 1000)
    assert kv.allocate_slots(req, 20)  # positions 0..19: 5 blocks
    req.num_computed_tokens = 20
    kv.cache_full_blocks(req)
    assert kv.pool.num_used_blocks == 5
    # the next query (position 20) sees positions 15..20: blocks 0-2 (positions 0..11) go
    assert kv.allocate_slots(req, 1)
    assert kv.pool.num_used_blocks == 3  # blocks 3, 4 and the new one
    kv.check_invariants()
    assert len(kv.get_block_ids("r")) == 6  # the table keeps its shape (stand-ins first)
    kv.free(req)
    kv.check_invariants()
    assert kv.pool.num_used_blocks == 0


def test_full_attention_models_keep_every_block():
    kv = KVCacheManager(32, 4, sliding_window=None)
    req = Request("r", list(range(100, 140)), SamplingParams(max_tokens=8), [], 1000)
    assert kv.allocate_slots(req, 20)
    req.num_computed_tokens = 20
    assert kv.allocate_slots(req, 1)
    assert kv.pool.num_used_blocks == 6


def test_mistral_window_parity_with_freed_blocks(tmp_path):
    """A window of 8 over blocks of 16: long prompts free most of their blocks while they
    prefill in chunks and decode."""
    model = make_hf_model("mistral", sliding_window=8)
    model.config._attn_implementation = "eager"
    llm = LLM(str(save_hf_folder(model, tmp_path / "m")), kv_cache_memory_gib=0.05)
    core = llm.engine.core
    assert core.kv_manager.sliding_window == 8
    prompt = list(range(300, 400))
    with torch.no_grad():
        ref = model(torch.tensor([prompt])).logits[0].float()
    for chunk in (None, 7):
        assert (sequence_logits(core, prompt, chunk_size=chunk) - ref).abs().max() <= 1e-4
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    assert out == hf_greedy(model, prompt, 20)
    core.kv_manager.check_invariants()
