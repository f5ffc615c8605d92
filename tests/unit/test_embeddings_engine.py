"""Pooling requests through the engine (LLM.embed) against transformers' hidden states on the
same random weights: last-token and mean pooling of a decoder, chunked, batched beside
generation, with a Matryoshka cut; and a prefix-cache hit never changes a mean."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tokenmill import LLM, SamplingParams
from tokenmill.pooling_params import PoolingParams

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors.",
    "a " * 40,
    "Hi",
]


@pytest.fixture(scope="module")
def hf_and_llm(tiny_llama_dir):
    import transformers

    hf = transformers.AutoModel.from_pretrained(tiny_llama_dir).float().eval()
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, max_num_batched_tokens=32)
    return hf, llm


def _reference(hf, ids: list[int], kind: str) -> torch.Tensor:
    with torch.no_grad():
        states = hf(torch.tensor([ids])).last_hidden_state[0]  # after the final norm
    vector = states[-1] if kind == "LAST" else states.mean(dim=0)
    return F.normalize(vector, dim=0)


def _cos(a, b) -> float:
    return float(F.cosine_similarity(torch.tensor(a), b, dim=0))


@pytest.mark.parametrize("kind", ["LAST", "MEAN"])
def test_decoder_pooling_equals_transformers(hf_and_llm, kind):
    hf, llm = hf_and_llm
    tok = llm.get_tokenizer()
    outs = llm.embed(PROMPTS, PoolingParams(pooling_type=kind))  # 32-token chunks
    for prompt, out in zip(PROMPTS, outs, strict=True):
        vector = out.outputs.embedding  # vLLM's shape
        assert out.prompt_token_ids == tok.encode(prompt) and out.finished
        ref = _reference(hf, tok.encode(prompt), kind)
        assert len(vector) == ref.shape[0]
        assert _cos(vector, ref) >= 0.99999
        assert abs(float(torch.tensor(vector).norm()) - 1.0) < 1e-5


def test_default_is_last_token_and_dimensions_cut(hf_and_llm):
    hf, llm = hf_and_llm
    ids = llm.get_tokenizer().encode(PROMPTS[0])
    full = llm.embed([ids])[0].outputs.embedding
    assert _cos(full, _reference(hf, ids, "LAST")) >= 0.99999
    cut = llm.embed([ids], PoolingParams(dimensions=16))[0].outputs.embedding
    expected = F.normalize(torch.tensor(full)[:16], dim=0)
    assert torch.allclose(torch.tensor(cut), expected, atol=1e-6)


def test_pooling_beside_generation_and_cache_hits(hf_and_llm):
    """Generation in the same steps leaves the vectors as they were alone; the same prompt
    embedded again (its blocks now cached) gets the same mean."""
    hf, llm = hf_and_llm
    engine = llm.engine
    tok = llm.get_tokenizer()
    ids = tok.encode(PROMPTS[2])
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    engine.add_request("gen", PROMPTS[0], params)
    pooled = SamplingParams(max_tokens=1)
    engine.add_request("emb", ids, pooled, pooling_params=PoolingParams(pooling_type="MEAN"))
    results = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out
        engine.core.check_invariants()
    assert len(results["gen"].outputs[0].token_ids) == 5
    assert results["emb"].outputs[0].token_ids == []
    assert _cos(results["emb"].pooled, _reference(hf, ids, "MEAN")) >= 0.99999
    again = llm.embed([ids], PoolingParams(pooling_type="MEAN"))[0].outputs.embedding
    assert _cos(again, _reference(hf, ids, "MEAN")) >= 0.99999


def test_folder_pooling_config_is_the_default(tiny_llama_dir, tmp_path):
    """A folder with sentence-transformers' modules.json pools as it says (mean here)."""
    import shutil

    folder = tmp_path / "st"
    shutil.copytree(tiny_llama_dir, folder)
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": True})
    )
    import transformers

    hf = transformers.AutoModel.from_pretrained(folder).float().eval()
    llm = LLM(str(folder), kv_cache_memory_gib=0.05)
    ids = llm.get_tokenizer().encode(PROMPTS[1])
    vector = llm.embed([ids])[0].outputs.embedding
    assert _cos(vector, _reference(hf, ids, "MEAN")) >= 0.99999


def test_too_many_dimensions_is_refused(hf_and_llm):
    _, llm = hf_and_llm
    with pytest.raises(ValueError, match="dimensions"):
        llm.embed(["x"], PoolingParams(dimensions=10_000))
