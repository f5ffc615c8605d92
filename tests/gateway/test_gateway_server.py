"""The gateway in a real `tokenmill serve --gateway-config` on the embedded model, driven with
the official openai client: guardrail actions (outputs pinned by JSON schemas), tool policy
(calls forced by tool_choice), usage, limits, secrets kept out of logs, the ledger after a
kill -9."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml
from openai import APIError, BadRequestError, OpenAI, RateLimitError

from tests.server.conftest import MODEL, start_server
from tokenmill.gateway.store.database import open_database
from tokenmill.gateway.store.ledger import Ledger

ADMIN = "admin-" + "k" * 40
EMAIL = "jane.doe@example.com"
CONFIG = {
    "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
    "prices": {"default": {"input": 0.5, "cached_input": 0.25, "output": 1.5}},
    "guardrails": {"rules": [
        {"name": "emails", "scanner": "pii", "entities": ["email"], "action": "redact"},
        {"name": "secrets", "scanner": "secrets", "action": "block", "stages": ["input"]},
        {"name": "competitor", "scanner": "deny_list", "terms": ["acme corp"], "action": "fallback",
         "fallback": "I can't discuss that.", "stages": ["input"]},
        {"name": "audit-paris", "scanner": "regex", "pattern": "Paris", "action": "audit"},
        {"name": "out-block", "scanner": "regex", "pattern": "ZEBRA-[0-9]{4}", "action": "block",
         "stages": ["output"]},
        {"name": "out-fallback", "scanner": "deny_list", "terms": ["falcon project"],
         "action": "fallback", "fallback": "Redirected.", "stages": ["output"]},
    ]},
    "tool_policies": {"strict": {"allow": ["get_weather"], "refusal": "Tool call refused by policy."}},
}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "delete_files", "parameters": {
        "type": "object", "properties": {"path": {"type": "string", "enum": ["/"]}}, "required": ["path"]}}},
]  # fmt: skip


def schema_format(value: str) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"v": {"const": value}}, "required": ["v"],
        "additionalProperties": False}}}  # fmt: skip


def write_config(tmp_path) -> str:
    path = tmp_path / "gateway.yaml"
    config = {
        **CONFIG,
        "database": str(tmp_path / "gw.sqlite3"),
        "journal": str(tmp_path / "journal"),
    }
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    srv = start_server(tmp, "--gateway-config", write_config(tmp), "--max-num-seqs", "16")
    srv.tmp = tmp
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def admin(gw) -> httpx.Client:
    return httpx.Client(
        base_url=gw.base_url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60
    )


def new_key(gw, **fields) -> tuple[str, str]:
    with admin(gw) as a:
        reply = a.post("/admin/keys", json=fields)
    assert reply.status_code == 201, reply.text
    return reply.json()["key"], reply.json()["id"]


def client(gw, key: str) -> OpenAI:
    return OpenAI(base_url=gw.v1, api_key=key, max_retries=0, timeout=120)


def chat_text(c: OpenAI, stream: bool, **kw) -> tuple[str, object]:
    args = dict(model=MODEL, temperature=0, max_tokens=kw.pop("max_tokens", 40), **kw)
    if not stream:
        reply = c.chat.completions.create(**args)
        return reply.choices[0].message.content or "", reply
    chunks = list(
        c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    )
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices), chunks


def test_keys_are_required_and_never_logged(gw):
    key, _ = new_key(gw, name="plain")
    for bad in ("unused", key + "x"):
        with pytest.raises(Exception) as err:
            client(gw, bad).models.list()
        assert getattr(err.value, "status_code", None) == 401
    assert client(gw, key).models.list().data[0].id == MODEL
    assert httpx.get(f"{gw.base_url}/health").status_code == 200  # open path
    chat_text(client(gw, key), False, messages=[{"role": "user", "content": "hi"}])
    with admin(gw) as a:
        a.get("/admin/usage")
    time.sleep(0.5)
    assert key not in gw.log() and ADMIN not in gw.log()
    data = b"".join(
        p.read_bytes() for p in gw.tmp.rglob("*") if p.is_file() and "server-" not in p.name
    )
    assert key.encode() not in data and ADMIN.encode() not in data


@pytest.mark.parametrize("stream", [False, True])
def test_redact_and_audit_on_model_output(gw, stream):
    key, key_id = new_key(gw)
    c = client(gw, key)
    msg = [{"role": "user", "content": "Give the contact."}]
    text, _ = chat_text(c, stream, messages=msg, response_format=schema_format(f"mail {EMAIL} now"))
    assert EMAIL not in text and "mail " in text and " now" in text
    text, _ = chat_text(c, stream, messages=msg, response_format=schema_format("Paris"))
    assert json.loads(text) == {"v": "Paris"}  # audit: untouched
    with admin(gw) as a:
        events = a.get("/admin/guardrail_events", params={"key_id": key_id}).json()["data"]
        dashboard = a.get("/admin/guardrail_events").text
    # the ledger keeps the kind of match and a masked form, never the redacted text
    assert sorted((e["rule"], e["action"], e["matched_text"]) for e in events) == [
        ("audit-paris", "audit", "audit-paris: … (5 chars)"),
        ("emails", "redact", f"email: j…m ({len(EMAIL)} chars)")]  # fmt: skip
    assert EMAIL not in dashboard
    database = (gw.tmp / "gw.sqlite3").read_bytes()
    journal = b"".join(p.read_bytes() for p in (gw.tmp / "journal").rglob("*") if p.is_file())
    assert EMAIL.encode() not in database + journal


def test_input_block_and_fallback(gw):
    key, _ = new_key(gw)
    c = client(gw, key)
    with pytest.raises(BadRequestError) as err:
        chat_text(c, False, messages=[{"role": "user", "content": "key AKIAIOSFODNN7EXAMPLE ok?"}])
    assert err.value.body["code"] == "guardrail_blocked" and "AKIA" not in str(err.value.body)
    for stream in (False, True):
        text, _ = chat_text(c, stream, messages=[{"role": "user", "content": "About ACME Corp?"}])
        assert text == "I can't discuss that."
    reply = c.responses.create(model=MODEL, input="What about Acme Corp?")
    assert reply.output_text == "I can't discuss that."
    events = list(c.responses.create(model=MODEL, input="What about Acme Corp?", stream=True))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "I can't discuss that."


@pytest.mark.parametrize("stream", [False, True])
def test_tool_policy_on_forced_calls_with_n(gw, stream):
    key, key_id = new_key(gw, tool_policy="strict")
    c = client(gw, key)
    for name, allowed in (("delete_files", False), ("get_weather", True)):
        args = dict(model=MODEL, temperature=0, max_tokens=60, n=2, tools=TOOLS,
                    messages=[{"role": "user", "content": "Do it."}],
                    tool_choice={"type": "function", "function": {"name": name}})  # fmt: skip
        if stream:
            chunks = list(c.chat.completions.create(stream=True, **args))
            for index in range(2):
                mine = [
                    ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].index == index
                ]
                calls = [tc for ch in mine for tc in ch.delta.tool_calls or []]
                text = "".join(ch.delta.content or "" for ch in mine)
                if allowed:
                    assert [tc.function.name for tc in calls] == ["get_weather"]
                    assert json.loads(calls[0].function.arguments)["city"] in ("Paris", "Rome")
                else:
                    assert calls == [] and text.endswith("Tool call refused by policy.")
        else:
            reply = c.chat.completions.create(**args)
            for choice in reply.choices:
                if allowed:
                    assert choice.message.tool_calls[0].function.name == "get_weather"
                else:
                    assert not choice.message.tool_calls
                    assert choice.message.content.endswith("Tool call refused by policy.")
    with admin(gw) as a:
        audited = a.get("/admin/tool_call_events", params={"key_id": key_id}).json()["data"]
    assert sorted((e["tool_name"], e["allowed"]) for e in audited) == sorted(
        [("delete_files", False)] * 2 + [("get_weather", True)] * 2)  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_responses_api_tool_policy_and_redaction(gw, stream):
    key, _ = new_key(gw, tool_policy="strict")
    c = client(gw, key)
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]}
             for t in TOOLS]  # fmt: skip
    args = dict(model=MODEL, input="Do it.", tools=tools, max_output_tokens=40,
                tool_choice={"type": "function", "name": "delete_files"})  # fmt: skip
    if stream:
        with c.responses.stream(**args) as s:
            events = list(s)
            final = s.get_final_response()
        assert [e.sequence_number for e in events] == list(range(len(events)))
    else:
        final = c.responses.create(**args)
    assert not [o for o in final.output if o.type == "function_call"]
    assert final.output_text.endswith("Tool call refused by policy.")
    fmt = {"format": {"type": "json_schema", "name": "x", "strict": True,
                      "schema": schema_format(f"to {EMAIL}")["json_schema"]["schema"]}}  # fmt: skip
    reply = c.responses.create(
        model=MODEL, input="Contact?", text=fmt, max_output_tokens=40, stream=False
    )
    assert EMAIL not in reply.output_text and "to " in reply.output_text
    stored = c.responses.retrieve(reply.id)  # what the store kept is shown through the filter too
    assert stored.output_text == reply.output_text


def test_rate_limit_exact_on_the_server(gw):
    key, _ = new_key(gw, rpm=5)
    c = client(gw, key)
    results = []

    def one():
        try:
            chat_text(c, False, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            results.append(200)
        except RateLimitError:
            results.append(429)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [200] * 5 + [429] * 7


def test_usage_endpoint_matches_what_clients_were_told(gw):
    key, key_id = new_key(gw)
    c = client(gw, key)
    told = [0, 0]
    for i in range(6):
        _, reply = chat_text(
            c, i % 2 == 1, messages=[{"role": "user", "content": f"Count to {i}."}]
        )
        usage = reply.usage if i % 2 == 0 else reply[-1].usage
        told[0] += usage.prompt_tokens
        told[1] += usage.completion_tokens
    with httpx.Client(base_url=gw.base_url, headers={"Authorization": f"Bearer {key}"}) as h:
        own = h.get("/v1/usage", params={"group_by": "key"}).json()["data"]
        assert h.get("/v1/usage", params={"key_id": "key_someone_else"}).status_code == 403
        assert h.get("/admin/keys").status_code == 401
    metrics = httpx.get(f"{gw.base_url}/metrics").text  # an open path, with the gateway's series
    for name in ("gateway_requests_total", "gateway_spend_usd_total", "gateway_ledger_pending_rows",
                 "gateway_admission_seconds", "gateway_unauthorized_total"):  # fmt: skip
        assert f"tokenmill:{name}" in metrics, name
    assert [(r["key_id"], r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in own] == [
        (key_id, 6, told[0], told[1])]  # fmt: skip


def test_kill_9_loses_no_completed_row(tmp_path):
    srv = start_server(tmp_path, "--gateway-config", write_config(tmp_path), "--max-num-seqs", "8")
    try:
        key, _ = new_key(srv)
        done: dict[str, int] = {}
        stop = threading.Event()

        def worker(w: int):
            with httpx.Client(
                base_url=srv.v1, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as h:
                for i in range(1000):
                    if stop.is_set():
                        return
                    rid = f"w{w}-{i}"
                    try:
                        r = h.post("/chat/completions", headers={"x-request-id": rid}, json={
                            "model": MODEL, "max_tokens": 8, "temperature": 0,
                            "messages": [{"role": "user", "content": f"Say {i}"}]})  # fmt: skip
                    except httpx.HTTPError:
                        return
                    if r.status_code == 200:
                        done[rid] = r.json()["usage"]["completion_tokens"]

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while len(done) < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(srv.proc.pid, signal.SIGKILL)  # the API process: no shutdown, no flush
        srv.proc.wait()
        stop.set()
        for t in threads:
            t.join()
        assert len(done) >= 30
    finally:
        srv.stop()
        os.system(f"pkill -9 -f 'tokenmill.*{srv.base_url.rsplit(':', 1)[1]}' >/dev/null 2>&1")
    ledger = Ledger.open(str(tmp_path / "gw.sqlite3"), tmp_path / "journal")  # replays the journal
    try:
        assert ledger.flush(30)
        rows = dict(open_database(str(tmp_path / "gw.sqlite3")).fetchall(
            "SELECT request_id, completion_tokens FROM usage"))  # fmt: skip
    finally:
        ledger.close()
    missing = [rid for rid in done if rid not in rows]
    assert not missing, f"{len(missing)} completed requests have no row"
    assert all(rows[rid] == n for rid, n in done.items())


def test_stored_objects_belong_to_their_key(gw):
    a, a_id = new_key(gw)
    b, _ = new_key(gw)
    made = client(gw, a).responses.create(model=MODEL, input="Hi", max_output_tokens=4)
    with httpx.Client(base_url=gw.v1, timeout=30) as h:
        mine = h.get(f"/responses/{made.id}", headers={"Authorization": f"Bearer {a}"})
        theirs = h.get(f"/responses/{made.id}", headers={"Authorization": f"Bearer {b}"})
        assert mine.status_code == 200 and theirs.status_code == 404
        with admin(gw) as adm:
            rotated = adm.post(f"/admin/keys/{a_id}/rotate").json()["key"]
        again = h.get(f"/responses/{made.id}", headers={"Authorization": f"Bearer {rotated}"})
        assert again.status_code == 200  # the owner is the key, not its secret


def test_a_user_key_reaches_the_api_and_the_rest_takes_the_admin_key(gw):
    """Adapters, caches, engine state and paths the gateway does not know are the admin's: a
    user key gets 403 there (fail closed), the admin key gets through."""
    key, _ = new_key(gw, name="paths")
    user = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=gw.base_url, timeout=60) as h, admin(gw) as a:
        for method, path, body in (
            ("POST", "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/etc"}),
            ("POST", "/v1/unload_lora_adapter", {"lora_name": "x"}),
            ("POST", "/reset_prefix_cache", None),
            ("GET", "/server_info", None),
            ("GET", "/kv_cache", None),
            ("GET", "/v1/no_such_route", None),
        ):
            reply = h.request(method, path, json=body, headers=user)
            assert reply.status_code == 403, (path, reply.text)
            assert reply.json()["error"]["code"] == "admin_key_required"
            assert h.request(method, path, json=body).status_code == 401
        assert a.get("/server_info").status_code == 200
        assert a.post("/reset_prefix_cache").status_code == 200
        tokens = h.post("/tokenize", json={"model": MODEL, "prompt": "hi"}, headers=user)
        assert tokens.status_code == 200
        assert h.get(f"/v1/models/{MODEL}", headers=user).status_code == 200
        assert h.get("/ui/api/series", headers=user).status_code == 200


def test_a_key_limited_to_models_lists_only_those(gw):
    limited, _ = new_key(gw, models=["another-model"])
    allowed, _ = new_key(gw, models=[MODEL, "another-model"])
    assert client(gw, limited).models.list().data == []
    assert [m.id for m in client(gw, allowed).models.list().data] == [MODEL]
    assert client(gw, allowed).models.retrieve(MODEL).id == MODEL
    with httpx.Client(base_url=gw.v1, headers={"Authorization": f"Bearer {limited}"}) as h:
        reply = h.get(f"/models/{MODEL}")
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "model_not_found"


def run_batch(gw, key: str, lines: int) -> dict[str, dict]:
    """A chat batch of `lines` lines under `key`, run to its end: custom_id -> response."""
    c = client(gw, key)
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    jsonl = "\n".join(
        json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
                    "body": {**body, "messages": [{"role": "user", "content": f"Count to {i}."}]}})
        for i in range(lines)
    )  # fmt: skip
    file = c.files.create(file=("in.jsonl", jsonl.encode()), purpose="batch")
    batch = c.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.time() + 120
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.time() < deadline, batch
        time.sleep(0.2)
        batch = c.batches.retrieve(batch.id)
    out = {}
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            for text in c.files.content(file_id).text.splitlines():
                line = json.loads(text)
                out[line["custom_id"]] = line["response"]
    assert sorted(out) == [f"l{i}" for i in range(lines)]
    return out


def test_batch_lines_meet_their_key_s_models_budget_and_ledger(gw):
    """A batch runs later, inside the server: each line still goes through the gateway as the
    key that made the batch, as that key's requests would."""
    limited, _ = new_key(gw, models=["another-model"])
    assert {r["status_code"] for r in run_batch(gw, limited, 2).values()} == {403}
    spent, _ = new_key(gw, budget_usd=1e-12)
    answers = run_batch(gw, spent, 3).values()
    assert {(r["status_code"], r["body"]["error"]["code"]) for r in answers} == {
        (429, "budget_exceeded")}  # fmt: skip
    metered, metered_id = new_key(gw)
    answers = run_batch(gw, metered, 3)
    assert {r["status_code"] for r in answers.values()} == {200}
    told = [sum(r["body"]["usage"][k] for r in answers.values())
            for k in ("prompt_tokens", "completion_tokens")]  # fmt: skip
    with httpx.Client(base_url=gw.base_url, headers={"Authorization": f"Bearer {metered}"}) as h:
        own = h.get("/v1/usage", params={"group_by": "key"}).json()["data"]
    assert [(r["key_id"], r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in own] == [
        (metered_id, 3, *told)]  # fmt: skip


def test_the_classifier_rule_asks_the_served_model(tmp_path):
    """A model-based guardrail under `serve`: the judge's request reaches the served model (a
    judge that cannot be asked is a classifier_error, here set to block)."""
    rule = {"name": "no-cats", "scanner": "classifier", "positive": "yes", "threshold": 0.5,
            "prompt": "Is this about cats? Answer yes or no.\n\n{text}", "action": "block",
            "on_error": "block", "stages": ["input"]}  # fmt: skip
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({
        "admin_key_sha256": CONFIG["admin_key_sha256"], "database": str(tmp_path / "gw.sqlite3"),
        "journal": str(tmp_path / "journal"), "guardrails": {"rules": [rule]}}))  # fmt: skip
    srv = start_server(tmp_path, "--gateway-config", str(path))
    try:
        key, _ = new_key(srv)
        for text in ("tell me about dogs", "my cat sleeps all day"):
            try:
                chat_text(client(srv, key), False, messages=[{"role": "user", "content": text}],
                          max_tokens=2)  # fmt: skip
            except BadRequestError as e:  # the judge said yes
                assert e.body["code"] == "guardrail_blocked"
        with admin(srv) as a:
            events = a.get("/admin/guardrail_events").json()["data"]
        assert not [e for e in events if "classifier_error" in e["matched_text"]], events
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


def test_bad_bodies_get_4xx_and_the_gateway_keeps_serving(gw):
    from tests.gateway.test_gateway_hostile import BAD_BODIES

    key, key_id = new_key(gw, tool_policy="strict")
    with httpx.Client(
        base_url=gw.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as h:
        for path, body in BAD_BODIES:
            reply = h.post(path, content=body, headers={"content-type": "application/json"})
            assert 400 <= reply.status_code < 500, (
                path,
                body[:80],
                reply.status_code,
                reply.text[:300],
            )
            assert "error" in reply.json(), reply.text[:200]
        reply = h.post("/v1/chat/completions", content=b"x" * (5 * 1024 * 1024))
        assert reply.status_code == 413 and reply.json()["error"]["code"] == "body_too_large"
        good = h.post("/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        assert good.status_code == 200
        own = h.get("/v1/usage", params={"group_by": "key"}).json()["data"]
    assert own[0]["requests"] >= len(BAD_BODIES) + 1  # each one metered (a 4xx, no tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_output_block_and_fallback(gw, stream):
    key, _ = new_key(gw)
    c = client(gw, key)
    msg = [{"role": "user", "content": "Give the code."}]
    pinned = schema_format("code ZEBRA-1234 ok")
    if stream:
        seen = []
        with pytest.raises(APIError) as err:
            for chunk in c.chat.completions.create(model=MODEL, messages=msg, temperature=0,
                                                   max_tokens=40, stream=True, response_format=pinned):  # fmt: skip
                seen.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        assert "ZEBRA" not in "".join(seen) and "1234" not in "".join(seen)
        assert "guardrail" in str(err.value.message) or "policy" in str(err.value.message)
    else:
        with pytest.raises(BadRequestError) as err:
            chat_text(c, False, messages=msg, response_format=pinned)
        assert err.value.body["code"] == "guardrail_blocked" and "ZEBRA" not in str(err.value.body)
    text, _ = chat_text(
        c, stream, messages=msg, response_format=schema_format("the falcon project is on")
    )
    assert "falcon" not in text.lower() and text.endswith("Redirected.")


@pytest.mark.slow  # ~45 s; the in-process version (tests/gateway/test_gateway_ledger.py) runs always
def test_ledger_equals_client_usage_over_500_mixed_requests(gw):
    """Non-streamed, streamed with and without usage, 4xx errors and clients leaving mid-stream,
    8 at a time: each row holds exactly the usage its client was told."""
    import random
    from concurrent.futures import ThreadPoolExecutor

    key, key_id = new_key(gw)
    rng = random.Random(5)
    plan = [(f"mix-{i}", rng.choice(["json", "stream_usage", "stream", "error", "leave"]), rng.randint(2, 10))
            for i in range(500)]  # fmt: skip
    told: dict[str, tuple[int, int, int]] = {}

    def one(item):
        rid, kind, n = item
        body = {"model": MODEL, "max_tokens": n, "temperature": 0, "ignore_eos": True,
                "messages": [{"role": "user", "content": f"Item {rid}: say something."}]}  # fmt: skip
        headers = {"Authorization": f"Bearer {key}", "x-request-id": rid}
        with httpx.Client(base_url=gw.v1, headers=headers, timeout=120) as h:
            if kind == "error":
                assert (
                    h.post("/chat/completions", json={**body, "temperature": -1}).status_code == 400
                )
            elif kind == "json":
                u = h.post("/chat/completions", json=body).json()["usage"]
                told[rid] = (
                    u["prompt_tokens"],
                    u["prompt_tokens_details"]["cached_tokens"],
                    u["completion_tokens"],
                )
            else:
                body["stream"] = True
                if kind == "stream_usage":
                    body["stream_options"] = {"include_usage": True}
                with h.stream("POST", "/chat/completions", json=body) as r:
                    lines = []
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            lines.append(json.loads(line[6:]))
                        if kind == "leave" and len(lines) >= 3:
                            break  # closes the connection mid-stream
                if kind == "stream_usage":
                    u = lines[-1]["usage"]
                    told[rid] = (
                        u["prompt_tokens"],
                        u["prompt_tokens_details"]["cached_tokens"],
                        u["completion_tokens"],
                    )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, plan))
    time.sleep(1.0)  # the last disconnects reach the server
    with admin(gw) as a:
        rows = a.get("/admin/usage", params={"key_id": key_id, "group_by": "key"}).json()["data"]
    assert rows[0]["requests"] == 500
    db = open_database(str(gw.tmp / "gw.sqlite3"))
    deadline = time.monotonic() + 10
    while True:
        got = {r[0]: r[1:] for r in db.fetchall(
            "SELECT request_id, prompt_tokens, cached_tokens, completion_tokens, status FROM usage WHERE key_id = ?",
            (key_id,))}  # fmt: skip
        if len(got) == 500 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(got) == 500
    for rid, usage in told.items():
        assert got[rid][:3] == usage, rid
    statuses = {
        kind: [got[rid][3] for rid, k, _ in plan if k == kind]
        for kind in ("error", "leave", "json")
    }
    assert set(statuses["error"]) == {400} and set(statuses["json"]) == {200}
    assert set(statuses["leave"]) <= {
        499,
        200,
    }  # a very short answer may finish before the client leaves
    assert sum(u[2] for u in told.values()) == sum(got[rid][2] for rid in told)


# ---------------------------------------------------------------- the CLI beside a running serve


def tm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", *args], capture_output=True, text=True, timeout=120
    )


def within(seconds: float, check) -> float:
    """Seconds until `check()` held (fails past `seconds`)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < seconds, f"not within {seconds} s"
        time.sleep(0.1)
    return time.monotonic() - t0


def reloads(gw) -> float:
    metrics = httpx.get(f"{gw.base_url}/metrics").text
    line = 'tokenmill:gateway_config_reloads_total{result="ok"} '
    return sum(float(x[len(line):]) for x in metrics.splitlines() if x.startswith(line))


def forced_call(gw, key: str, tool: str):
    return client(gw, key).chat.completions.create(
        model=MODEL, temperature=0, max_tokens=60, tools=TOOLS,
        messages=[{"role": "user", "content": "Do it."}],
        tool_choice={"type": "function", "function": {"name": tool}},
    ).choices[0].message  # fmt: skip


def test_cli_keys_and_config_edits_reach_a_running_serve(gw):
    """As a user runs it: `tokenmill keys create/revoke --gateway-config` beside a running
    `tokenmill serve --gateway-config`, effective within key_refresh_s (1 s by default; 3 s
    allowed here); edits to the config file applied without a restart; a key whose tool
    policy a reload removes has its tool calls refused (fails closed)."""
    config_path = gw.tmp / "gateway.yaml"
    original = config_path.read_text()
    out = tm("keys", "create", "--gateway-config", str(config_path), "--name", "cli")
    assert out.returncode == 0, out.stderr
    secret, key_id = json.loads(out.stdout)["key"], json.loads(out.stdout)["id"]

    def status(key: str) -> int:
        return httpx.get(f"{gw.v1}/models", headers={"Authorization": f"Bearer {key}"}).status_code

    within(3.0, lambda: status(secret) == 200)
    assert tm("keys", "revoke", key_id, "--gateway-config", str(config_path)).returncode == 0
    within(3.0, lambda: status(secret) == 401)

    # a policy added by an edit: a key made for it (the CLI checks the name against the file)
    edited = yaml.safe_load(original)
    edited["tool_policies"]["any-tool"] = {"refusal": "unused"}
    before = reloads(gw)
    config_path.write_text(yaml.safe_dump(edited))
    try:
        within(5.0, lambda: reloads(gw) > before)
        out = tm("keys", "create", "--gateway-config", str(config_path), "--tool-policy", "any-tool")
        assert out.returncode == 0, out.stderr
        key = json.loads(out.stdout)["key"]
        within(3.0, lambda: status(key) == 200)
        assert forced_call(gw, key, "delete_files").tool_calls[0].function.name == "delete_files"
        # the policy removed from the file: the key's tool calls are refused, not let through
        before = reloads(gw)
        config_path.write_text(original)
        within(5.0, lambda: reloads(gw) > before)
        refused = forced_call(gw, key, "delete_files")
        assert not refused.tool_calls and "policy is not defined" in refused.content
    finally:
        config_path.write_text(original)
