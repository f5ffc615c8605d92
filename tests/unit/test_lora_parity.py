"""Multi-LoRA against PEFT's PeftModel on the same random weights (fp32): three adapters of
different ranks and target modules, each alone and all three plus the base in one batch
(prompt logprobs at every position within 1e-4, greedy tokens equal); a GGUF LoRA of the
same weights gives the same; the prefix cache never serves one adapter's blocks to another."""

from __future__ import annotations

import pytest
import torch

from tests.lora_models import ADAPTERS, make_peft_adapters, write_gguf_lora
from tokenmill import LLM, SamplingParams

PROMPTS = [
    "The capital of France is a city where",
    "SELECT name FROM users WHERE",
    "Roses are red, violets are",
    "Once upon a time, far away, there lived a small dragon who",
]
TOL = 1e-4


@pytest.fixture(scope="module")
def adapters(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    return make_peft_adapters(tiny_llama_dir, root)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, adapters):
    return LLM(
        str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_num_batched_tokens=64,
        lora_modules=tuple(f"{n}={p}" for n, p in adapters.items()), max_lora_rank=16,
    )  # fmt: skip


def _reference(base_dir, adapter_dir, ids: list[int]) -> torch.Tensor:
    """log_softmax of PEFT's logits at every position (the base's when adapter_dir is None)."""
    import transformers
    from peft import PeftModel

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir).float().eval()
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)


def _check(out, ref: torch.Tensor, ids: list[int]) -> None:
    """Every prompt position's logprob of the next prompt token and its top 5, and the
    greedy continuation's, against the reference."""
    for pos, entry in enumerate(out.prompt_logprobs[1:], start=1):
        for token, lp in entry.items():
            assert abs(lp.logprob - float(ref[pos - 1, token])) < TOL, (pos, token)
    generated = out.outputs[0].token_ids
    assert generated[0] == int(ref[len(ids) - 1].argmax())


def _run(llm, names):
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS[: len(names)]]
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=5, logprobs=5)
    outs = llm.generate(ids, params, lora_name=names)
    return ids, outs


@pytest.mark.parametrize("name", [a[0] for a in ADAPTERS])
def test_each_adapter_alone_equals_peft(llm, tiny_llama_dir, adapters, name):
    (ids,), (out,) = _run(llm, [name])
    _check(out, _reference(tiny_llama_dir, adapters[name], ids), ids)


def test_three_adapters_and_the_base_in_one_batch(llm, tiny_llama_dir, adapters):
    names = [a[0] for a in ADAPTERS] + [None]
    ids, outs = _run(llm, names)
    for name, prompt_ids, out in zip(names, ids, outs, strict=True):
        ref = _reference(tiny_llama_dir, adapters[name] if name else None, prompt_ids)
        _check(out, ref, prompt_ids)
    # the whole continuation too, against PEFT's greedy decoding of its own output
    for name, prompt_ids, out in zip(names, ids, outs, strict=True):
        full = prompt_ids + out.outputs[0].token_ids[:-1]
        ref = _reference(tiny_llama_dir, adapters[name] if name else None, full)
        assert out.outputs[0].token_ids == ref[len(prompt_ids) - 1 :].argmax(dim=-1).tolist()


def test_decode_steps_mixing_adapters(llm, tiny_llama_dir, adapters):
    """32 requests over the three adapters and the base, decoding together (the stacked
    form), equal to one at a time (the segment form)."""
    tok = llm.get_tokenizer()
    names = [[a[0] for a in ADAPTERS] + [None]][0] * 8
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(len(names))]
    params = SamplingParams(max_tokens=6, temperature=0.0, logprobs=3)
    together = llm.generate(prompts, params, lora_name=names)
    for i in (0, 1, 2, 3):
        (alone,) = llm.generate([prompts[i]], params, lora_name=names[i])
        assert alone.outputs[0].token_ids == together[i].outputs[0].token_ids
        for a, b in zip(alone.outputs[0].logprobs, together[i].outputs[0].logprobs, strict=True):
            for token in a:
                assert abs(a[token].logprob - b[token].logprob) < TOL


def test_gguf_lora_equals_the_peft_folder(tiny_llama_dir, adapters, tmp_path):
    from tests.tiny_models import make_hf_model

    cfg = make_hf_model("llama").config
    gguf_path = write_gguf_lora(
        adapters["chat"], tmp_path / "chat.gguf", cfg.num_attention_heads, cfg.num_key_value_heads
    )
    llm = LLM(
        str(tiny_llama_dir), kv_cache_memory_gib=0.05,
        lora_modules=(f"chat-gguf={gguf_path}", f"chat={adapters['chat']}"), max_lora_rank=16,
    )  # fmt: skip
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[0])
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=5)
    a, b = llm.generate([ids, ids], params, lora_name=["chat-gguf", "chat"])
    _check(a, _reference(tiny_llama_dir, adapters["chat"], ids), ids)
    assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_prefix_cache_is_keyed_by_adapter(llm):
    """The same prompt under another adapter (or the base) finds no cached block; under the
    same adapter it does."""
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[3] * 3)
    params = SamplingParams(max_tokens=2, temperature=0.0)
    first = llm.generate([ids], params, lora_name="sql")[0]
    same = llm.generate([ids], params, lora_name="sql")[0]
    other = llm.generate([ids], params, lora_name="poet")[0]
    base = llm.generate([ids], params)[0]
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens > 0
    assert other.num_cached_tokens == 0 and base.num_cached_tokens == 0
    llm.engine.core.check_invariants()


@pytest.mark.parametrize("form", ["per-adapter matmuls", "per-request loop"])
def test_every_form_of_the_deltas_gives_the_same(llm, monkeypatch, form):
    """The padded segment form (the default here), one matmul pair per adapter's rows, and
    the naive loop over requests: the same logprobs."""
    from tokenmill.model import lora_step

    tok = llm.get_tokenizer()
    names = [a[0] for a in ADAPTERS] * 3 + [None]
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(len(names))]
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=3, prompt_logprobs=2)
    padded = llm.generate(prompts, params, lora_name=names)
    lora = llm.engine.core.runner.lora
    if form == "per-request loop":
        monkeypatch.setattr(lora, "mode", "per_request")
    else:
        monkeypatch.setattr(lora_step, "PAD_LIMIT", 0)
    other = llm.generate(prompts, params, lora_name=names)
    for a, b in zip(padded, other, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for pa, pb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert all(abs(pa[t].logprob - pb[t].logprob) < TOL for t in pa)


def _fp16_copy(peft_dir, out):
    """The PEFT folder with every weight rounded to fp16 (kept in fp32)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(peft_dir, out)
    path = out / "adapter_model.safetensors"
    save_file({k: v.half().float() for k, v in load_file(str(path)).items()}, str(path))
    return out


@pytest.mark.parametrize("lora_dtype", ["float32", "auto"])
def test_deltas_beside_packed_native_weights(tiny_llama_dir, adapters, tmp_path, lora_dtype):
    """On a Q8_0 base run packed by the native method (float kernels: int_dot off), the
    adapters equal PEFT over the same Q8_0 weights dequantized: the deltas run beside the
    packed blocks, which stay as they are. With --lora-dtype auto (fp16 adapters over a
    quantized base, the C kernel) the reference is PEFT on the fp16-rounded adapters (the
    ADAPTERS' alpha/r are powers of two: rounding commutes with the scaling)."""
    import transformers

    from tests.tiny_models import save_hf_folder
    from tokenmill.model.packed import PackedWeight, as_float
    from tokenmill.quant.groups import linear_groups
    from tokenmill.quant.weights import convert

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir).float()
    state = hf.state_dict()
    with torch.no_grad():
        for name in linear_groups(state, hf.config.tie_word_embeddings):
            packed = convert(state[name], "q8_0", "native")
            assert isinstance(packed, PackedWeight)
            state[name].copy_(as_float(packed).view_as(state[name]))
    dequantized = save_hf_folder(hf, tmp_path / "q8-dequantized")
    llm = LLM(
        str(tiny_llama_dir), weights="q8_0", int_dot=False, kv_cache_memory_gib=0.05,
        lora_modules=tuple(f"{n}={p}" for n, p in adapters.items()), max_lora_rank=16,
        lora_dtype=lora_dtype,
    )  # fmt: skip
    assert llm.engine.core.config.model_config.plan.method == "native"
    layer = llm.engine.core.model.layers[0]
    assert type(layer.qkv_proj.base).__name__ == "PackedLinear"  # wrapped, never merged
    lora = llm.engine.core.runner.lora
    assert lora.kernel == (lora_dtype == "auto")
    reference = adapters
    if lora_dtype == "auto":
        reference = {n: _fp16_copy(p, tmp_path / f"{n}-fp16") for n, p in adapters.items()}
    names = [a[0] for a in ADAPTERS] + [None]
    ids, outs = _run(llm, names)
    for name, prompt_ids, out in zip(names, ids, outs, strict=True):
        ref = _reference(dequantized, reference[name] if name else None, prompt_ids)
        _check(out, ref, prompt_ids)
    lora.mode = "per_request"  # one delta call per request: the same numbers
    _, again = _run(llm, names)
    for a, b in zip(outs, again, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for pa, pb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert all(abs(pa[t].logprob - pb[t].logprob) < 1e-5 for t in pa)


def _two_lora_llm_recording_steps(tiny_llama_dir, adapters) -> tuple[LLM, list[list]]:
    """An LLM with --max-loras 2, and each step's adapter per request (None: the base)."""
    llm = LLM(
        str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_loras=2, max_lora_rank=16,
        lora_modules=tuple(f"{n}={p}" for n, p in adapters.items()),
    )  # fmt: skip
    lora = llm.engine.core.runner.lora
    steps: list[list] = []
    begin = lora.begin_step

    def spy(rows, num_rows):
        steps.append([name for name, _, _ in rows])
        begin(rows, num_rows)

    lora.begin_step = spy
    return llm, steps


def test_max_loras_bounds_the_adapters_a_batch_mixes(tiny_llama_dir, adapters):
    """--max-loras 2: no step runs three adapters; every request still finishes, as alone."""
    llm, steps = _two_lora_llm_recording_steps(tiny_llama_dir, adapters)
    names = [a[0] for a in ADAPTERS] * 2 + [None]
    tok = llm.get_tokenizer()
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(len(names))]
    params = SamplingParams(max_tokens=5, temperature=0.0)
    outs = llm.generate(prompts, params, lora_name=names)
    seen = [{name for name in step if name is not None} for step in steps]
    assert max(len(s) for s in seen) == 2 and all(len(o.outputs[0].token_ids) == 5 for o in outs)
    for i in (0, 1, 2):
        (alone,) = llm.generate([prompts[i]], params, lora_name=names[i])
        assert alone.outputs[0].token_ids == outs[i].outputs[0].token_ids


def test_a_request_whose_adapter_must_wait_does_not_hold_back_the_queue(tiny_llama_dir, adapters):
    """--max-loras 2 with two adapters running: a third adapter's request waits, and the base
    and running-adapter requests queued behind it are admitted in the same step (vLLM's
    skip); it runs once an adapter frees, with the tokens it gets alone."""
    llm, steps = _two_lora_llm_recording_steps(tiny_llama_dir, adapters)
    a, b, c = (name for name, *_ in ADAPTERS)
    names = [a, b, c, None, a]
    tok = llm.get_tokenizer()
    prompts = [tok.encode(PROMPTS[i % len(PROMPTS)]) for i in range(len(names))]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    outs = llm.generate(prompts, params, lora_name=names)
    assert sorted(steps[0], key=str) == sorted([a, b, None, a], key=str)  # c skipped, not a wall
    assert any(c in step for step in steps[1:])
    (alone,) = llm.generate([prompts[2]], params, lora_name=c)
    assert outs[2].outputs[0].token_ids == alone.outputs[0].token_ids


def test_vllm_lora_request_loads_on_first_use(tiny_llama_dir, adapters, tmp_path):
    """vLLM's offline form: LLM(enable_lora=True) and generate(..., lora_request=...)."""
    from tokenmill import LoRARequest

    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, enable_lora=True, max_lora_rank=16)
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[1])
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=5, logprobs=5)
    request = LoRARequest("poet", 1, str(adapters["poet"]))
    out = llm.generate([ids], params, lora_request=request)[0]
    _check(out, _reference(tiny_llama_dir, adapters["poet"], ids), ids)
    mixed = llm.generate([ids, ids], params, lora_request=[None, request])  # loaded once
    assert mixed[1].outputs[0].token_ids == out.outputs[0].token_ids
    assert list(llm.engine.core.lora.model.adapters) == ["poet"]
    bare = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05)
    with pytest.raises(ValueError, match="enable_lora"):
        bare.generate([ids], params, lora_request=request)
