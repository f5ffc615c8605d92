"""Qwen3, Gemma 3, Phi-3, Mixtral, Qwen3-MoE, OLMoE and GPT-OSS against transformers on the
same random weights: logits (prefill, chunked over the KV cache, a prefix-cache hit) and greedy
tokens alone and in a batch."""

from __future__ import annotations

import pytest
import torch

from tests.family_models import FAMILIES, make_family_model
from tests.tiny_models import save_hf_folder
from tests.unit.test_model_parity import PROMPTS, hf_greedy
from tokenmill import LLM, SamplingParams
from tokenmill.engine.scoring import sequence_logits


def check_family(model, llm: LLM) -> None:
    core = llm.engine.core
    for prompt in PROMPTS:
        with torch.no_grad():
            ref = model(torch.tensor([prompt])).logits[0].float()
        for chunk in (None, 5):  # 5: every chunk after the first attends to cached blocks
            ours = sequence_logits(core, prompt, chunk_size=chunk)
            diff = (ours - ref).abs().max().item()
            assert diff <= 1e-4, f"{len(prompt)} tokens, chunks of {chunk}: logits differ {diff}"
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [hf_greedy(model, p, 12) for p in PROMPTS]
    alone = [llm.generate([{"prompt_token_ids": p}], params)[0] for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in alone] == expected
    hits_before = core.kv_manager.stats.hits
    batched = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in batched] == expected
    assert core.kv_manager.stats.hits > hits_before  # the prompts ran before: cached prefixes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_safetensors_parity(tmp_path, family):
    model = make_family_model(family)
    path = save_hf_folder(model, tmp_path / family)
    llm = LLM(str(path), kv_cache_memory_gib=0.05, max_num_batched_tokens=64)
    check_family(model, llm)


def test_longrope_tables_past_the_original_context():
    """Positions from original_max_position_embeddings on rotate with the long factors, as
    transformers computes them for a sequence that long (scaled by the same attention factor);
    the ones below with the short factors."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from tokenmill.model.arch_config import ArchConfig
    from tokenmill.model.models.rope import build_rotary

    model = make_family_model("phi3")
    hf_cfg = model.config
    cfg = ArchConfig.from_hf_config({**hf_cfg.to_dict(), "architectures": ["Phi3ForCausalLM"]})
    cut = cfg.rope_scaling.original_max_position_embeddings
    rope = build_rotary(cfg, 2 * cut, None, cfg.rope_scaling)
    init = ROPE_INIT_FUNCTIONS["longrope"]
    for seq_len, rows in ((None, slice(0, cut)), (cut + 1, slice(cut, 2 * cut))):
        inv_freq, scale = init(hf_cfg, None, seq_len=seq_len)
        pos = torch.arange(2 * cut)[rows].float()
        expected = torch.outer(pos, inv_freq).cos() * scale
        assert (rope.cos[rows] - expected).abs().max().item() < 1e-5


# GGUF stores no query_pre_attn_scalar for Gemma 3: llama.cpp takes head_dim
_GGUF_OVERRIDES = {"gemma3": {"query_pre_attn_scalar": 16}}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_gguf_parity(tmp_path, family):
    """A GGUF written from the same weights (llama.cpp's names and layouts) gives
    transformers' logits and tokens."""
    from tests.family_gguf import write_family_gguf

    model = make_family_model(family, **_GGUF_OVERRIDES.get(family, {}))
    path = tmp_path / f"{family}.gguf"
    write_family_gguf(model, family, path)
    llm = LLM(str(path), kv_cache_memory_gib=0.05, max_num_batched_tokens=64)
    assert llm.engine.core.model.config.architecture == family
    check_family(model, llm)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_moe_native_low_bit_experts(tmp_path, qtype):
    """Quantized expert tensors stay packed (one PackedLinear per expert, the native kernels)
    and give the float32 method's logits on the same file: both compute with the exactly
    dequantized blocks."""
    from tests.family_gguf import write_family_gguf
    from tokenmill.model.linear import PackedLinear
    from tokenmill.model.models.moe import SparseMoE

    model = make_family_model("qwen3_moe", intermediate_size=64, moe_intermediate_size=64)
    path = tmp_path / f"moe-{qtype}.gguf"
    write_family_gguf(model, "qwen3_moe", path, qtype)
    native = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    moe = [
        layer.mlp for layer in native.engine.core.model.layers if isinstance(layer.mlp, SparseMoE)
    ]
    assert moe and all(
        isinstance(e.gate_up_proj, PackedLinear) and isinstance(e.down_proj, PackedLinear)
        for m in moe for e in m.experts
    )  # fmt: skip
    reference = LLM(str(path), kv_cache_memory_gib=0.05, weights="float32")
    for prompt in PROMPTS:
        ours = sequence_logits(native.engine.core, prompt)
        ref = sequence_logits(reference.engine.core, prompt)
        assert (ours - ref).abs().max().item() <= 2e-3 * ref.abs().max().item()
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = native.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    want = reference.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]


@pytest.mark.parametrize("family", ["gemma3", "qwen3_moe", "gpt_oss"])
def test_speculation_and_structured_output_run_the_families(tmp_path, family):
    """n-gram speculation gives the tokens of plain decoding, and a regex constraint holds,
    on the families' own layers (sliding windows, sinks, experts)."""
    import re

    model = make_family_model(family)
    path = save_hf_folder(model, tmp_path / family)
    prompt = [5, 17, 923, 4411, 88, 301, 12, 7] * 4  # repeats: the n-gram lookup drafts
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = LLM(str(path), kv_cache_memory_gib=0.05)
    want = plain.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    spec = LLM(str(path), kv_cache_memory_gib=0.05, speculative="ngram",
               num_speculative_tokens=3, speculative_draft_policy="fixed")  # fmt: skip
    got = spec.generate([{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids
    assert got == want
    from tokenmill.sampling_params import StructuredOutputsParams

    constrained = SamplingParams(
        temperature=0,
        max_tokens=20,
        structured_outputs=StructuredOutputsParams(regex="[0-9]{3}-[a-z]{2}"),
    )
    text = plain.generate([{"prompt_token_ids": prompt}], constrained)[0].outputs[0].text
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", text), text


def test_weights_kld_gate_builds_the_family(tmp_path):
    """--max-kld measures a Qwen3 GGUF's packed weights against its float32 self (the
    reference model is built for the family, not as a Llama)."""
    from tests.family_gguf import write_family_gguf

    model = make_family_model("qwen3", intermediate_size=128)
    path = tmp_path / "qwen3-Q8_0.gguf"
    write_family_gguf(model, "qwen3", path, "Q8_0")
    llm = LLM(str(path), kv_cache_memory_gib=0.05, weights="native", max_kld=1.0)
    report = llm.engine.core.weights_kld
    assert report is not None and 0 <= report["mean_kld"] < 1e-2


def test_gpt_oss_mxfp4_checkpoint(tmp_path):
    """GPT-OSS as published: experts in MXFP4 blocks and scales, dequantized at load exactly as
    transformers dequantizes them (its convert_moe_packed_tensors is the reference)."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model = make_family_model("gpt_oss", intermediate_size=64)
    path = save_hf_folder(model, tmp_path / "gpt-oss")
    tensors = load_file(str(path / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    for name in [k for k in tensors if k.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, cols, rows = tensors.pop(name).shape  # stored [E, in, out]; MXFP4 packs rows of `in`
        blocks = torch.randint(0, 256, (e, rows, cols // 32, 16), dtype=torch.uint8, generator=gen)
        scales = torch.randint(122, 128, (e, rows, cols // 32), dtype=torch.uint8, generator=gen)
        tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        weight = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        module, attr = name.rsplit(".", 1)
        with torch.no_grad():
            getattr(model.get_submodule(module), attr).copy_(weight)
    save_file(tensors, str(path / "model.safetensors"))
    llm = LLM(str(path), kv_cache_memory_gib=0.05)
    check_family(model, llm)


def test_gemma3_multimodal_checkpoint_serves_its_language_model(tmp_path):
    """Gemma3ForConditionalGeneration (the 4B-27B checkpoints): text prompts give
    transformers' logits and tokens; the vision tower's weights are left out."""
    import transformers

    from tests.tiny_models import embedded_tokenizer

    vocab = embedded_tokenizer().vocab_size
    text = transformers.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16,
        initializer_range=0.15, max_position_embeddings=1024,
    )  # fmt: skip
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=28, patch_size=14,
    )  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4,
        image_token_index=vocab - 1, boi_token_index=vocab - 3, eoi_token_index=vocab - 2,
    )  # fmt: skip
    torch.manual_seed(1234)
    model = transformers.Gemma3ForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.2)
    model.config._attn_implementation = "eager"
    path = save_hf_folder(model, tmp_path / "gemma3-mm")
    llm = LLM(str(path), kv_cache_memory_gib=0.05, max_num_batched_tokens=64)
    assert llm.engine.core.model.config.architecture == "gemma3"
    check_family(model, llm)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_fused_expert_tensors_load_per_expert(tmp_path, family):
    """transformers 5's state-dict layout (a layer's experts as 3-D gate_up_proj and
    down_proj, what --load-format dummy makes) gives transformers' logits."""
    from safetensors.torch import save_file

    model = make_family_model(family)
    path = save_hf_folder(model, tmp_path / family)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    save_file(state, str(path / "model.safetensors"))
    llm = LLM(str(path), kv_cache_memory_gib=0.05)
    with torch.no_grad():
        ref = model(torch.tensor([PROMPTS[0]])).logits[0]
    assert (sequence_logits(llm.engine.core, PROMPTS[0]) - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "phi3"])
def test_families_decode_in_one_native_call(tmp_path, family, qtype, monkeypatch):
    """Qwen3's layers (per-head q/k norms), Gemma 3's (norms around each block, GELU,
    sliding-window layers with their own RoPE base) and Phi-3's (LongRoPE, here with partial
    rotation as Phi-4-mini's) run the one-call decoder on packed
    weights: the per-layer path's bits (its native norms, RoPE and activation), within the
    integer-dot bound of the float32 method on the same file, the same greedy tokens alone
    and batched."""
    from tests.family_gguf import write_family_gguf
    from tests.unit.test_model_parity import INT_DOT_BOUND

    path = tmp_path / f"{family}-{qtype}.gguf"
    write_family_gguf(make_family_model(family), family, path, qtype)
    fused = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    monkeypatch.setenv("TOKENMILL_FUSED_DECODE", "0")
    per_layer = LLM(str(path), kv_cache_memory_gib=0.05, weights="native")
    monkeypatch.delenv("TOKENMILL_FUSED_DECODE")
    reference = LLM(str(path), kv_cache_memory_gib=0.05, weights="float32")
    for prompt in PROMPTS:
        a = sequence_logits(fused.engine.core, prompt, chunk_size=1)  # single-token rows
        b = sequence_logits(per_layer.engine.core, prompt, chunk_size=1)
        ref = sequence_logits(reference.engine.core, prompt, chunk_size=1)
        assert torch.equal(a, b)
        assert (a - ref).abs().max().item() <= max(INT_DOT_BOUND, 1e-3)
    assert fused.engine.core.model._fused is not None
    assert per_layer.engine.core.model._fused is None
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    tokens = [o.outputs[0].token_ids for o in fused.generate(prompts, params)]
    assert tokens == [o.outputs[0].token_ids for o in per_layer.generate(prompts, params)]
    assert tokens == [o.outputs[0].token_ids for o in reference.generate(prompts, params)]
