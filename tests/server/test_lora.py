"""Multi-LoRA through a real `tokenmill serve --lora ...` process and the openai client:
adapters in /v1/models with their parent, a request's `model` picking its adapter (prompt
logprobs equal to PEFT's within 1e-4), load and unload at run time, and bad adapters
(another base's shapes, a rank above --max-lora-rank, a missing file, the base's name, one
in use) refused with a clear 400/404 while the running adapters keep answering the same."""

from __future__ import annotations

import threading

import httpx
import pytest
import torch

from tests.lora_models import make_peft_adapter, make_peft_adapters
from tests.server.conftest import start_server


@pytest.fixture(scope="module")
def lora_server(tiny_llama_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    folders = make_peft_adapters(tiny_llama_dir, root)
    loras = [arg for n in ("sql", "poet") for arg in ("--lora", f"{n}={folders[n]}")]
    srv = start_server(
        tmp_path_factory.mktemp("lora-server"), "--model", str(tiny_llama_dir), *loras,
        "--max-loras", "4", "--max-lora-rank", "16",
    )  # fmt: skip
    yield srv, folders
    assert srv.stop() == 0, srv.log()[-3000:]


def _client(srv):
    from openai import OpenAI

    return OpenAI(base_url=srv.v1, api_key="unused", max_retries=0, timeout=60)


def _prompt_logprobs(srv, model: str, prompt: str) -> tuple[list[int], list[float]]:
    """The prompt's tokens and each one's logprob given the ones before (echo + logprobs)."""
    out = _client(srv).completions.create(
        model=model, prompt=prompt, max_tokens=1, echo=True, logprobs=0, temperature=0
    )
    lp = out.choices[0].logprobs
    ids = httpx.post(f"{srv.base_url}/tokenize", json={"prompt": prompt}).json()["tokens"]
    return ids, lp.token_logprobs[1 : len(ids)]


def _peft(base_dir, adapter_dir, ids):
    import transformers
    from peft import PeftModel

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir).float().eval()
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir).eval()
    with torch.no_grad():
        lp = model(torch.tensor([ids])).logits[0].log_softmax(dim=-1)
    return [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]


PROMPT = "SELECT name FROM users WHERE the capital is"


def test_models_list_adapters_with_their_parent(lora_server):
    srv, _ = lora_server
    models = {m["id"]: m for m in httpx.get(f"{srv.v1}/models").json()["data"]}
    base = next(m for m in models.values() if m.get("parent") is None)
    assert models["sql"]["parent"] == base["id"] and models["poet"]["parent"] == base["id"]
    assert models["sql"]["lora"]["rank"] == 4
    assert models["sql"]["lora"]["dtype"] == "float32"  # a float32 base: exact deltas
    assert httpx.get(f"{srv.v1}/models/poet").json()["parent"] == base["id"]


def test_adapters_and_base_equal_peft_concurrently(lora_server, tiny_llama_dir):
    srv, folders = lora_server
    base = httpx.get(f"{srv.v1}/models").json()["data"][0]["id"]
    results: dict[str, tuple] = {}

    def run(model):
        results[model] = _prompt_logprobs(srv, model, PROMPT)

    threads = [threading.Thread(target=run, args=(m,)) for m in ("sql", "poet", base) * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model, folder in (("sql", folders["sql"]), ("poet", folders["poet"]), (base, None)):
        ids, got = results[model]
        ref = _peft(tiny_llama_dir, folder, ids)
        assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-4, model
    out = _client(srv).chat.completions.create(
        model="poet", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert out.model == "poet" and out.usage.completion_tokens == 3


def test_fp16_adapters_over_a_quantized_base_under_serve(lora_server, tiny_llama_dir, tmp_path):
    """`serve --weights q8_0`: the adapters run fp16 in the C kernel (--lora-dtype auto), and
    the served prompt logprobs equal the offline engine's on the same settings."""
    from tokenmill import LLM, SamplingParams
    from tokenmill.kernels import ops

    if not ops.kernels_available():
        pytest.skip("no C compiler for the native kernels")
    _, folders = lora_server
    srv = start_server(
        tmp_path, "--model", str(tiny_llama_dir), "--weights", "q8_0",
        "--lora", f"sql={folders['sql']}", "--max-lora-rank", "16",
    )  # fmt: skip
    try:
        models = {m["id"]: m for m in httpx.get(f"{srv.v1}/models").json()["data"]}
        assert models["sql"]["lora"]["dtype"] == "float16"
        ids, served = _prompt_logprobs(srv, "sql", PROMPT)
    finally:
        assert srv.stop() == 0
    llm = LLM(
        str(tiny_llama_dir), weights="q8_0", kv_cache_memory_gib=0.05, max_lora_rank=16,
        lora_modules=(f"sql={folders['sql']}",),
    )  # fmt: skip
    assert llm.engine.core.runner.lora.kernel
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    out = llm.generate([ids], params, lora_name=["sql"])[0]
    offline = [out.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]
    assert max(abs(a - b) for a, b in zip(served, offline, strict=True)) < 1e-5


def test_serve_with_a_missing_adapter_exits_with_one_clear_line(tmp_path, tiny_llama_dir, fresh_cache):
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "serve", "--model", str(tiny_llama_dir),
         "--lora", f"gone={tmp_path / 'nope'}", "--port", "0", "--kv-cache-memory", "0.05"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ),  # $TOKENMILL_CACHE: fresh_cache
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: engine core failed to start: lora_path: '{tmp_path / 'nope'}' does not exist"
    )
    assert "Traceback" not in proc.stderr


def test_load_use_and_unload_at_run_time(lora_server, tiny_llama_dir):
    srv, folders = lora_server
    r = httpx.post(
        f"{srv.v1}/load_lora_adapter", json={"lora_name": "chat", "lora_path": str(folders["chat"])}
    )
    assert r.status_code == 200, r.text
    assert "chat" in {m["id"] for m in httpx.get(f"{srv.v1}/models").json()["data"]}
    ids, got = _prompt_logprobs(srv, "chat", PROMPT)
    ref = _peft(tiny_llama_dir, folders["chat"], ids)
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-4
    # refused while a request runs with it
    client = _client(srv)
    stream = client.completions.create(
        model="chat", prompt="Once", max_tokens=400, stream=True, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    next(iter(stream))
    busy = httpx.post(f"{srv.v1}/unload_lora_adapter", json={"lora_name": "chat"})
    assert busy.status_code == 400 and "in use" in busy.json()["error"]["message"]
    stream.close()
    for _ in range(50):
        r = httpx.post(f"{srv.v1}/unload_lora_adapter", json={"lora_name": "chat"})
        if r.status_code == 200:
            break
        threading.Event().wait(0.1)
    assert r.status_code == 200, r.text
    gone = httpx.post(f"{srv.v1}/completions", json={"model": "chat", "prompt": "x"})
    assert gone.status_code == 404
    again = httpx.post(f"{srv.v1}/unload_lora_adapter", json={"lora_name": "chat"})
    assert again.status_code == 404


def test_bad_adapters_are_refused_and_the_others_unaffected(lora_server, tiny_llama_dir, tmp_path):
    from tests.tiny_models import make_hf_model, save_hf_folder

    srv, folders = lora_server
    before = _prompt_logprobs(srv, "sql", PROMPT)
    other_base = save_hf_folder(make_hf_model("llama", hidden_size=32), tmp_path / "other")
    other = make_peft_adapter(other_base, tmp_path / "other-lora", 4, 8, ["q_proj"], seed=9)
    big = make_peft_adapter(tiny_llama_dir, tmp_path / "big", 32, 8, ["q_proj"], seed=3)
    base = httpx.get(f"{srv.v1}/models").json()["data"][0]["id"]
    cases = [
        ({"lora_name": "other", "lora_path": str(other)}, 400, "another base"),
        ({"lora_name": "big", "lora_path": str(big)}, 400, "max-lora-rank"),
        ({"lora_name": "gone", "lora_path": str(tmp_path / "nope")}, 404, "does not exist"),
        ({"lora_name": base, "lora_path": str(folders["chat"])}, 400, "served name"),
        ({"lora_name": "sql", "lora_path": str(folders["chat"])}, 400, "already loaded"),
        ({"lora_name": "", "lora_path": "x"}, 400, "lora_name"),
        ({"lora_path": "x"}, 400, "lora_name"),
        *[({"lora_name": name, "lora_path": str(folders["chat"])}, 400, "lora_name")
          for name in (" ", "a b", "\x00", "..", "x\ny")],
    ]  # fmt: skip
    for body, status, words in cases:
        r = httpx.post(f"{srv.v1}/load_lora_adapter", json=body)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert words in error["message"] or words == error["param"], (body, error)
    assert _prompt_logprobs(srv, "sql", PROMPT) == before
    assert {m["id"] for m in httpx.get(f"{srv.v1}/models").json()["data"]} >= {"sql", "poet"}


def test_lora_name_colliding_with_the_base_fails_at_start(tiny_llama_dir, lora_server, tmp_path):
    _, folders = lora_server
    with pytest.raises(RuntimeError, match="base model's served name"):
        start_server(
            tmp_path, "--model", str(tiny_llama_dir), "--served-model-name", "tiny",
            "--lora", f"tiny={folders['sql']}",
        )  # fmt: skip


def test_gateway_keys_limited_to_an_adapter(lora_server, tiny_llama_dir, tmp_path):
    """Behind the gateway a key's `models` allowlist takes adapter names, and the ledger
    records the adapter a request ran with."""
    import time

    from tests.gateway.harness import ADMIN_KEY, write_config
    from tokenmill.gateway.store.database import open_database

    _, folders = lora_server
    path = write_config(tmp_path)
    srv = start_server(
        tmp_path, "--model", str(tiny_llama_dir), "--lora", f"sql={folders['sql']}",
        "--gateway-config", str(path),
    )  # fmt: skip
    try:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(base_url=srv.base_url, headers=headers) as a:
            key = a.post("/admin/keys", json={"models": ["sql"]}).json()
        auth = {"Authorization": f"Bearer {key['key']}"}
        body = {"prompt": "hello", "max_tokens": 2}
        ok = httpx.post(f"{srv.v1}/completions", json={**body, "model": "sql"}, headers=auth)
        assert ok.status_code == 200 and ok.json()["model"] == "sql"
        models = httpx.get(f"{srv.v1}/models", headers=auth).json()["data"]
        assert [m["id"] for m in models] == ["sql"]  # the key's models only
        base_name = models[0]["parent"]
        base = httpx.post(f"{srv.v1}/completions", json={**body, "model": base_name}, headers=auth)
        assert base.status_code == 403
        db = open_database(str(tmp_path / "gateway.sqlite3"))
        rows: list = []
        for _ in range(50):
            rows = db.fetchall(
                "SELECT model, completion_tokens FROM usage WHERE key_id = ? AND status = 200",
                (key["id"],),
            )
            if rows:
                break
            time.sleep(0.2)
        assert rows == [("sql", 2)]
    finally:
        assert srv.stop() == 0
