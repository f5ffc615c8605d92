"""POST /v1/embeddings against real `tokenmill serve` processes, through the official openai
client and LangChain's OpenAIEmbeddings: a BERT encoder (sentence-transformers folder)
equal to sentence-transformers, a decoder equal to transformers' last-token state, base64
and dimensions, usage; bad input a 400 in OpenAI's envelope, the server serving on."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.embedding_models import make_bert_folder
from tests.server.conftest import start_server

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello world", "search query: model?"]


@pytest.fixture(scope="module")
def bert_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert") / "tiny-bert"
    make_bert_folder(folder, "mean")
    srv = start_server(tmp_path_factory.mktemp("bert-server"), "--model", str(folder))
    yield srv, folder
    assert srv.stop() == 0, srv.log()[-3000:]


def _client(srv):
    from openai import OpenAI

    return OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=60)


def _cos(a, b) -> torch.Tensor:
    return F.cosine_similarity(torch.tensor(np.asarray(a), dtype=torch.float32), b.float())


def test_bert_openai_client_equals_sentence_transformers(bert_server):
    from sentence_transformers import SentenceTransformer

    srv, folder = bert_server
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    client = _client(srv)
    (model,) = [m.id for m in client.models.list().data]
    res = client.embeddings.create(model=model, input=TEXTS)
    assert [d.index for d in res.data] == [0, 1, 2]
    assert _cos([d.embedding for d in res.data], reference).min() >= 0.99999
    tok = sum(len(ids) for ids in _token_ids(srv, TEXTS))
    assert res.usage.prompt_tokens == tok == res.usage.total_tokens
    # the openai client asks for base64 unless told otherwise; as floats it is the same
    floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert np.allclose(
        [d.embedding for d in floats.data], [d.embedding for d in res.data], atol=1e-6
    )
    raw = httpx.post(
        f"{srv.v1}/embeddings", json={"input": "hello world", "encoding_format": "base64"}
    ).json()
    assert isinstance(raw["data"][0]["embedding"], str)
    assert np.allclose(
        np.frombuffer(__import__("base64").b64decode(raw["data"][0]["embedding"]), "<f4"),
        floats.data[1].embedding,
        atol=1e-6,
    )


def _token_ids(srv, texts):
    return [
        httpx.post(f"{srv.base_url}/tokenize", json={"prompt": t}).json()["tokens"] for t in texts
    ]


def test_token_id_inputs_and_dimensions(bert_server):
    srv, _ = bert_server
    client = _client(srv)
    ids = _token_ids(srv, TEXTS)
    by_text = client.embeddings.create(model=None, input=TEXTS, encoding_format="float")
    by_ids = client.embeddings.create(input=ids, model=None, encoding_format="float")
    one = client.embeddings.create(input=ids[0], model=None, encoding_format="float")
    assert np.allclose([d.embedding for d in by_ids.data], [d.embedding for d in by_text.data])
    assert np.allclose(one.data[0].embedding, by_text.data[0].embedding)
    cut = client.embeddings.create(input=TEXTS, model=None, dimensions=8, encoding_format="float")
    for full, short in zip(by_text.data, cut.data, strict=True):
        expected = F.normalize(torch.tensor(full.embedding[:8]), dim=0)
        assert np.allclose(short.embedding, expected.numpy(), atol=1e-6)


def test_langchain_openai_embeddings(bert_server):
    from langchain_openai import OpenAIEmbeddings
    from sentence_transformers import SentenceTransformer

    srv, folder = bert_server
    emb = OpenAIEmbeddings(
        model="tiny-bert",
        base_url=srv.v1,
        api_key="unused",
        check_embedding_ctx_length=False,  # send text, not tiktoken ids of another vocabulary
        max_retries=0,
    )
    docs = emb.embed_documents(TEXTS)
    query = emb.embed_query(TEXTS[1])
    reference = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert _cos(docs, reference).min() >= 0.99999
    assert _cos([query], reference[1:2]).item() >= 0.99999


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ["x"] * 10_000}, "input"),
        ({"input": ""}, "input"),
        ({"input": ["hello", ""]}, "input.1"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": [1.5, 2]}, "input.0"),
        ({"input": [["a"]]}, "input.0.0"),
        ({"input": "hi", "encoding_format": "bytes"}, "encoding_format"),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "dimensions": 100_000}, "dimensions"),
        ({}, "input"),
        ({"input": [[5, 6], [5, 10**6]]}, "input.1"),  # outside the vocabulary
        ({"input": [5] * 10_000}, "input"),  # beyond the context
        ({"input": ["hi", " ".join(["fox"] * 200)]}, "input.1"),
    ],
)
def test_bad_input_is_a_400(bert_server, body, param):
    srv, _ = bert_server
    r = httpx.post(f"{srv.v1}/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    ok = httpx.post(f"{srv.v1}/embeddings", json={"input": "hello"}, timeout=60)
    assert ok.status_code == 200


def test_encoder_refuses_generation_with_a_400(bert_server):
    srv, _ = bert_server
    for path, body in (
        ("completions", {"model": "tiny-bert", "prompt": "hello", "max_tokens": 2}),
        (
            "chat/completions",
            {"model": "tiny-bert", "messages": [{"role": "user", "content": "hi"}]},
        ),
    ):
        r = httpx.post(f"{srv.v1}/{path}", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert "embedding" in r.json()["error"]["message"]
    assert httpx.post(f"{srv.v1}/embeddings", json={"input": "hi"}).status_code == 200


def test_unknown_model_is_a_404(bert_server):
    srv, _ = bert_server
    r = httpx.post(f"{srv.v1}/embeddings", json={"input": "x", "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


def test_decoder_embeddings_equal_transformers(tmp_path, tiny_llama_dir):
    """A decoder through the server: its last token's final state, normalised (vLLM's
    --task embed default), next to generation on the same server."""
    import transformers

    srv = start_server(tmp_path, "--model", str(tiny_llama_dir))
    try:
        client = _client(srv)
        model = client.models.list().data[0].id
        res = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
        hf = transformers.AutoModel.from_pretrained(tiny_llama_dir).float().eval()
        for ids, d in zip(_token_ids(srv, TEXTS), res.data, strict=True):
            with torch.no_grad():
                state = hf(torch.tensor([ids])).last_hidden_state[0, -1]
            assert _cos([d.embedding], F.normalize(state, dim=0)[None]).item() >= 0.99999
        out = client.completions.create(model=model, prompt="hello", max_tokens=3)
        assert out.usage.completion_tokens == 3
    finally:
        assert srv.stop() == 0


def test_gateway_meters_embeddings(tmp_path, bert_server):
    """Behind the gateway: a key's embeddings calls in the ledger with the prompt tokens the
    client was told; a key limited to other models gets a 403; an input guardrail blocks."""
    from tests.gateway.harness import ADMIN_KEY, write_config
    from tokenmill.gateway.store.database import open_database

    _, folder = bert_server
    path = write_config(tmp_path, {"guardrails": {"rules": [
        {"name": "competitor", "scanner": "deny_list", "terms": ["acme corp"],
         "action": "fallback", "fallback": "No.", "stages": ["input"]},
    ]}})  # fmt: skip
    srv = start_server(tmp_path, "--model", str(folder), "--gateway-config", str(path))
    try:
        with httpx.Client(
            base_url=srv.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        ) as a:
            key_reply = a.post("/admin/keys", json={}).json()
            limited = a.post("/admin/keys", json={"models": ["another-model"]}).json()
        from openai import OpenAI, PermissionDeniedError

        c = OpenAI(base_url=srv.v1, api_key=key_reply["key"], max_retries=0)
        told = sum(
            c.embeddings.create(model="tiny-bert", input=TEXTS[: i + 1]).usage.prompt_tokens
            for i in range(3)
        )
        blocked = httpx.post(
            f"{srv.v1}/embeddings",
            json={"model": "tiny-bert", "input": ["fine", "about Acme Corp"]},
            headers={"Authorization": f"Bearer {key_reply['key']}"},
        )
        assert blocked.status_code == 400
        assert blocked.json()["error"]["code"] == "guardrail_blocked"
        with pytest.raises(PermissionDeniedError):
            OpenAI(base_url=srv.v1, api_key=limited["key"], max_retries=0).embeddings.create(
                model="tiny-bert", input="hello"
            )
        db = open_database(str(tmp_path / "gateway.sqlite3"))
        rows: list = []
        for _ in range(50):
            rows = db.fetchall(
                "SELECT endpoint, model, prompt_tokens, completion_tokens, status FROM usage"
                " WHERE key_id = ? AND status = 200",
                (key_reply["id"],),
            )
            if len(rows) == 3:
                break
            __import__("time").sleep(0.2)
        assert len(rows) == 3
        assert {(r[0], r[1], r[3]) for r in rows} == {("embeddings", "tiny-bert", 0)}
        assert sum(r[2] for r in rows) == told
    finally:
        assert srv.stop() == 0
