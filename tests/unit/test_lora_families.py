"""LoRA adapters on the families beyond Llama against PEFT on transformers (fp32, same
random weights): Qwen3 and Gemma 3 (separate q/k/v and gate/up), Phi-3 (PEFT trains on its
fused qkv_proj and gate_up_proj), Mixtral and Qwen3-MoE (attention: their MLP is experts).
An adapter on an expert, or on a module the model's layers lack, is refused by name."""

from __future__ import annotations

import pytest
import torch

from tests.family_models import make_family_model
from tests.lora_models import make_peft_adapter
from tests.tiny_models import save_hf_folder
from tokenmill import LLM, SamplingParams

PROMPTS = [list(range(3, 24)), [5, 9, 2, 7, 11, 40, 41, 42]]
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
CASES = {
    "qwen3": ALL,
    "gemma3": ALL,
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
    "mixtral": ATTENTION,
    "qwen3_moe": ATTENTION,
}


def _peft_logprobs(base_dir, adapter_dir, ids: list[int]) -> torch.Tensor:
    import transformers
    from peft import PeftModel

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir).float()
    model = PeftModel.from_pretrained(model, adapter_dir).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].log_softmax(dim=-1)


@pytest.mark.parametrize("family", list(CASES))
def test_adapters_on_each_family_equal_peft(family, tmp_path):
    base = save_hf_folder(make_family_model(family), tmp_path / family)
    adapters = {
        "wide": make_peft_adapter(base, tmp_path / "wide", 8, 16, CASES[family], seed=1),
        "narrow": make_peft_adapter(base, tmp_path / "narrow", 4, 4, CASES[family][:2], seed=2),
    }
    llm = LLM(
        str(base), kv_cache_memory_gib=0.05, max_lora_rank=8,
        lora_modules=tuple(f"{n}={p}" for n, p in adapters.items()),
    )  # fmt: skip
    names = ["wide", "narrow"]
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, lora_name=names)
    for name, ids, out in zip(names, PROMPTS, outs, strict=True):
        ref = _peft_logprobs(base, adapters[name], ids)
        got = [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
        want = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4, name
        assert out.outputs[0].token_ids[0] == int(ref[-1].argmax())


def test_pattern_keys_match_as_peft_matches_them(tmp_path):
    """alpha_pattern / rank_pattern keys are matched, as PEFT matches them, against the end of
    the module's name in the model (whole dotted parts; a key may be a regular expression)."""
    base = save_hf_folder(make_family_model("qwen3"), tmp_path / "qwen3")
    patterns = dict(
        alpha_pattern={"layers.1.self_attn.q_proj": 32, "model.layers.0.self_attn.v_proj": 2,
                       r"mlp\.(down|up)_proj": 5},
        rank_pattern={"model.layers.1.mlp.down_proj": 2},
    )  # fmt: skip
    targets = ["q_proj", "v_proj", "up_proj", "down_proj"]
    adapter = make_peft_adapter(base, tmp_path / "p", 4, 8, targets, seed=5, **patterns)
    llm = LLM(str(base), kv_cache_memory_gib=0.05, max_lora_rank=8,
              lora_modules=(f"p={adapter}",))  # fmt: skip
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    ids = PROMPTS[0]
    out = llm.generate([{"prompt_token_ids": ids}], params, lora_name=["p"])[0]
    ref = _peft_logprobs(base, adapter, ids)
    got = [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
    want = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4


def test_adapters_on_experts_or_missing_modules_are_refused_by_name(tmp_path):
    from tokenmill.engine.lora_manager import LoRAManager

    base = save_hf_folder(make_family_model("mixtral"), tmp_path / "mixtral")
    experts = make_peft_adapter(base, tmp_path / "experts", 4, 8, ["w1", "w3"], seed=3)
    llm = LLM(str(base), kv_cache_memory_gib=0.05, enable_lora=True)
    manager: LoRAManager = llm.engine.core.lora
    with pytest.raises(ValueError, match="target_modules"):
        manager.load("experts", str(experts))
    # a Llama-named adapter on a Phi-3 base, whose layers hold q/k/v fused
    phi = save_hf_folder(make_family_model("phi3"), tmp_path / "phi3")
    llama = save_hf_folder(make_family_model("qwen3"), tmp_path / "qwen3")
    split = make_peft_adapter(llama, tmp_path / "split", 4, 8, ["q_proj"], seed=4)
    phi_llm = LLM(str(phi), kv_cache_memory_gib=0.05, enable_lora=True)
    with pytest.raises(ValueError, match="target_modules: adapter 'split' targets q_proj"):
        phi_llm.engine.core.lora.load("split", str(split))
    assert not manager.model.adapters and not phi_llm.engine.core.lora.model.adapters
