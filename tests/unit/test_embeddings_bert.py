"""BERT encoders (sentence-transformers folders) through the engine against
sentence-transformers and transformers on the same random weights: mean and CLS pooling as
the folder says, many prompts batched in one step, and generation refused by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.embedding_models import make_bert_folder
from tokenmill import LLM, SamplingParams
from tokenmill.pooling_params import PoolingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "hello world",
    "embeddings map text to vectors",
    "search query: what is a model?",
    "a",
]


@pytest.mark.parametrize("pooling,normalize", [("mean", True), ("cls", True), ("cls", False)])
def test_bert_equals_sentence_transformers(tmp_path, pooling, normalize):
    """The folder's own pooling and Normalize module (or its absence), and a prompt that
    fills the whole context (an embedding generates nothing: no position is kept back)."""
    from sentence_transformers import SentenceTransformer

    folder = tmp_path / f"bert-{pooling}"
    make_bert_folder(folder, pooling, normalize=normalize)
    st = SentenceTransformer(str(folder), device="cpu")
    longest = " ".join(["fox"] * 126)  # [CLS] + 126 + [SEP]: the 128 positions
    texts = [*TEXTS, longest]
    reference = st.encode(texts, convert_to_tensor=True).float()
    llm = LLM(str(folder), kv_cache_memory_gib=0.02)
    assert len(llm.get_tokenizer().encode(longest)) == 128 == llm.engine.max_model_len
    vectors = torch.tensor([o.outputs.embedding for o in llm.embed(texts)])
    assert torch.allclose(vectors, reference, rtol=1e-4, atol=1e-5)
    norms = vectors.norm(dim=1)
    assert torch.allclose(norms, torch.ones(len(texts)), atol=1e-5) == normalize
    with pytest.raises(ValueError, match="129 tokens do not fit the context length of 128"):
        llm.embed([longest + " fox"])


def test_bert_equals_transformers_pooling(tmp_path):
    """The pooling computed here from transformers' token states: the mean over the
    prompt (no padding), the CLS state; both through PoolingParams over one model."""
    folder = tmp_path / "bert"
    hf = make_bert_folder(folder, "mean", normalize=False)
    llm = LLM(str(folder), kv_cache_memory_gib=0.02, max_num_seqs=64)
    tok = llm.get_tokenizer()
    texts = TEXTS * 8  # 40 prompts: several steps' worth, batched
    mean = torch.tensor([o.outputs.embedding for o in llm.embed(texts)])
    cls_outs = llm.embed(texts, PoolingParams(pooling_type="CLS", normalize=False))
    cls = torch.tensor([o.outputs.embedding for o in cls_outs])
    for i, text in enumerate(texts):
        ids = tok.encode(text)
        assert ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]
        with torch.no_grad():
            states = hf(torch.tensor([ids])).last_hidden_state[0]
        ref_mean = F.normalize(states.mean(dim=0), dim=0)
        assert F.cosine_similarity(mean[i], ref_mean, dim=0) >= 0.99999
        assert torch.allclose(cls[i], states[0], atol=1e-4)


def test_bert_refuses_generation(tmp_path):
    folder = tmp_path / "bert"
    make_bert_folder(folder)
    llm = LLM(str(folder), kv_cache_memory_gib=0.02)
    with pytest.raises(ValueError, match="encoder"):
        llm.generate(["hello"], SamplingParams(max_tokens=2))
    assert llm.embed(["hello"])[0].outputs.hidden_size == 48  # still serving
