"""A float16 KV pool (--kv-cache-dtype float16) on the CPU: the conversions against torch's,
the paged attention kernels over float16 against the same kernels over the pool widened to
float32 (every build; only the summation order of the portable body may differ), and the
engine against a float32 pool (the backend against torch's: test_prefill_attention.py)."""

from __future__ import annotations

import math

import pytest
import torch

from tests.kernel_builds import KERNEL_BUILDS, kernel_build
from tests.unit.test_prefill_attention import BS, layout, reference

I16 = torch.int16


@pytest.fixture(scope="module", params=KERNEL_BUILDS)
def lib(request):
    return kernel_build(request.param)


def _edge_floats() -> torch.Tensor:
    """Random values over half's range and past it, and the cases rounding must get right:
    ties to even, the largest half and the first values that round to inf, subnormals and the
    values below them, signed zeros, inf."""
    g = torch.Generator().manual_seed(0)
    spread = torch.randn(20_000, generator=g) * torch.exp2(torch.randint(-30, 20, (20_000,), generator=g))
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(I16).view(torch.float16).float()
    finite = halves[torch.isfinite(halves)]
    ulp = torch.nextafter(finite, torch.full_like(finite, math.inf)) - finite
    special = torch.tensor([65504.0, 65519.99, 65520.0, 65536.0, 2.0**-24, 2.0**-25, 2.0**-26,
                            1.5 * 2.0**-25, 2.0**-14, 0.0, -0.0, math.inf, -math.inf, 1e-40])  # fmt: skip
    # every half, the midpoints between neighbours (ties) and values just off them
    mids = finite[:-1] + (finite[1:] - finite[:-1]) / 2
    return torch.cat([spread, finite, mids, mids + ulp[:-1] / 4, special, -special])


@pytest.mark.parametrize("vector", [1, 0], ids=["vector", "scalar"])
def test_narrowing_rounds_as_torch_does(lib, vector):
    x = _edge_floats().contiguous()
    x = x[torch.isfinite(x) | torch.isinf(x)]
    out = torch.empty(x.shape, dtype=torch.float16)
    lib.tm_floats_to_halves(x.data_ptr(), x.numel(), out.data_ptr(), vector)
    want = x.to(torch.float16)
    assert torch.equal(out.view(I16), want.view(I16))


def test_widening_is_exact_for_every_half(lib):
    h = torch.arange(0, 1 << 16, dtype=torch.int32).to(I16).view(torch.float16)
    out = torch.empty(h.shape)
    lib.tm_halves_to_floats(h.data_ptr(), h.numel(), out.data_ptr())
    want = h.float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(out), nan)
    assert torch.equal(out[~nan].view(torch.int32), want[~nan].view(torch.int32))


def _decode(lib, q, kv, table, lens, nkv, scale, window=0):
    b, nh, hd = q.shape
    out = torch.empty_like(q)
    fn = lib.tm_paged_attention_decode_f16 if kv.dtype == torch.float16 else lib.tm_paged_attention_decode
    fn(q.data_ptr(), kv.data_ptr(), kv.shape[1], table.data_ptr(), lens.data_ptr(), b, nh, nkv,
       hd, BS, table.shape[1], scale, window, out.data_ptr(), 2)  # fmt: skip
    return out


def _prefill(lib, q, kv, table, starts, lens, nkv, scale, window=0):
    t, nh, hd = q.shape
    out = torch.full((t, nh * hd), float("nan"))
    fn = lib.tm_paged_attention_prefill_f16 if kv.dtype == torch.float16 else lib.tm_paged_attention_prefill
    fn(q.data_ptr(), q.stride(0), kv.data_ptr(), kv.shape[1], table.data_ptr(), table.shape[1],
       starts.data_ptr(), lens.data_ptr(), len(lens), nh, nkv, hd, BS, scale, window,
       out.data_ptr(), 2)  # fmt: skip
    return out


# (heads, KV heads, head size, window): the vector bodies (64, 128), the portable one (48)
SHAPES = [(9, 3, 64, 0), (8, 2, 128, 0), (6, 3, 48, 0), (9, 3, 64, 20)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_decode_over_float16_is_the_float32_kernel_on_the_widened_pool(lib, shape):
    nh, nkv, hd, window = shape
    g = torch.Generator().manual_seed(1)
    kv = torch.randn(2, 60, BS * nkv * hd, generator=g).half()
    lens = torch.tensor([1, 17, 300, 64, 257])  # 300 and 257: past one 256-key chunk
    table = torch.stack([torch.randperm(60, generator=g)[:20] for _ in lens])
    q = torch.randn(len(lens), nh, hd, generator=g)
    scale = hd**-0.5
    half = _decode(lib, q, kv, table, lens, nkv, scale, window)
    wide = _decode(lib, q, kv.float(), table, lens, nkv, scale, window)
    torch.testing.assert_close(half, wide, rtol=0, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_prefill_over_float16_is_the_float32_kernel_on_the_widened_pool(lib, shape):
    nh, nkv, hd, window = shape
    q, kv, table, starts, lens = layout([(37, 0), (5, 100), (70, 30)], nh, nkv, hd)
    kv = kv.nan_to_num(0.0).half()
    scale = hd**-0.5
    half = _prefill(lib, q, kv, table, starts, lens, nkv, scale, window)
    wide = _prefill(lib, q, kv.float(), table, starts, lens, nkv, scale, window)
    torch.testing.assert_close(half, wide, rtol=0, atol=1e-5)
    ref = reference(q, kv.float(), table, starts, lens, nkv, scale, window)
    assert torch.allclose(half, ref, atol=1e-5, rtol=0), (half - ref).abs().max()


# ---------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    """A tiny Llama (head size 64: the vector decode body) as a Q4_1 GGUF file."""
    from tests.tiny_models import make_hf_model
    from tests.unit.test_model_parity import write_gguf

    source = make_hf_model("llama", hidden_size=256, intermediate_size=256,
                           num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    path = tmp_path_factory.mktemp("kv16") / "tiny-Q4_1.gguf"
    write_gguf(source, path, "Q4_1")
    return str(path)


def _llm(path: str, **kw):
    from tokenmill import LLM

    return LLM(path, kv_cache_memory_gib=0.05, **kw)


def test_a_float16_pool_holds_twice_the_blocks_and_stays_within_its_rounding(model_path):
    """Logits over a float16 pool stay within the rounding of K/V to float16 of a float32
    pool's, whether the prompt is prefilled whole or a token at a time; a long prompt
    prefilled whole or in chunks of 7 gets the same bits (its rows read their keys from the
    pool either way)."""
    from tests.unit.test_model_parity import PROMPTS
    from tokenmill.engine.scoring import sequence_logits

    half, full = _llm(model_path, kv_cache_dtype="float16"), _llm(model_path)
    pools = half.engine.core.runner.kv_caches, full.engine.core.runner.kv_caches
    assert pools[0][0].dtype == torch.float16 and pools[1][0].dtype == torch.float32
    assert pools[0][0].shape[1] == 2 * pools[1][0].shape[1]
    assert half.engine.core.device_info()["kv_dtype"] == "float16"
    for prompt in PROMPTS:
        if len(prompt) > 8:  # no one-row chunk at the end (a one-row step is a decode)
            whole = sequence_logits(half.engine.core, prompt)
            assert torch.equal(sequence_logits(half.engine.core, prompt, chunk_size=7), whole)
        for chunk in (None, 1):
            a = sequence_logits(half.engine.core, prompt, chunk_size=chunk)
            b = sequence_logits(full.engine.core, prompt, chunk_size=chunk)
            assert (a - b).abs().max().item() <= 5e-2, (len(prompt), chunk)


def test_the_one_call_decoder_over_a_float16_pool_is_the_per_layer_path(model_path, monkeypatch):
    """The one-call decoder rounds the step's K/V into the float16 pool as torch does and
    reads them with the same kernel: the per-layer path's logits bit for bit, alone and
    batched with a prefix-cache hit."""
    from tests.unit.test_model_parity import PROMPTS
    from tokenmill import SamplingParams
    from tokenmill.engine.scoring import sequence_logits

    fused = _llm(model_path, kv_cache_dtype="float16")
    monkeypatch.setenv("TOKENMILL_FUSED_DECODE", "0")
    per_layer = _llm(model_path, kv_cache_dtype="float16")
    for prompt in PROMPTS:
        a = sequence_logits(fused.engine.core, prompt, chunk_size=1)
        assert torch.equal(a, sequence_logits(per_layer.engine.core, prompt, chunk_size=1))
    assert fused.engine.core.model._fused is not None
    assert per_layer.engine.core.model._fused is None
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    prompts = [{"prompt_token_ids": p} for p in [PROMPTS[1], PROMPTS[1][:40] + [7, 8], PROMPTS[0]]]
    for a, b in zip(fused.generate(prompts, params), per_layer.generate(prompts, params), strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs


def test_kv_cache_dtype_is_checked():
    from tokenmill.config import CacheConfig

    with pytest.raises(ValueError, match="cache_dtype"):
        CacheConfig(cache_dtype="fp8")


def test_speculative_decoding_over_a_float16_pool_is_lossless():
    """Verification rows (a request's drafts continuing one sequence) read the float16 pool
    as decodes do: n-gram speculation gives the same tokens and log-probabilities."""
    from tokenmill import LLM, SamplingParams

    text = "The quick brown fox jumps over the lazy dog. " * 6
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=1)
    spec = LLM(kv_cache_dtype="float16", speculative="ngram", kv_cache_memory_gib=0.1)
    plain = LLM(kv_cache_dtype="float16", kv_cache_memory_gib=0.1)
    a, b = spec.generate([text], params)[0].outputs[0], plain.generate([text], params)[0].outputs[0]
    assert spec.engine.core.drafter.stats.num_accepted_tokens > 0
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


@pytest.mark.parametrize("family", ["gemma3", "gpt_oss"])  # sliding windows; attention sinks
def test_families_over_a_float16_pool(tmp_path, family):
    """Sliding-window layers (the native kernels' windowed bodies) and attention sinks
    (torch's path, which widens the pool's K/V) over a float16 pool: within its rounding of a
    float32 pool's logits, prefilled whole and a token at a time."""
    from tests.family_gguf import write_family_gguf
    from tests.family_models import make_family_model
    from tokenmill.engine.scoring import sequence_logits

    path = tmp_path / f"{family}.gguf"
    write_family_gguf(make_family_model(family), family, path, "F32")
    half, full = _llm(str(path), kv_cache_dtype="float16"), _llm(str(path))
    ids = list(range(100, 160))
    for chunk, n in ((None, 60), (1, 20)):
        a = sequence_logits(half.engine.core, ids[:n], chunk_size=chunk)
        b = sequence_logits(full.engine.core, ids[:n], chunk_size=chunk)
        assert (a - b).abs().max().item() <= 5e-2, chunk
