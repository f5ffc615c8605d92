"""`tokenmill keys / usage / gateway migrate`, the config's errors (each names its key) and
its reload while requests run."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest
import yaml

from tests.gateway.harness import make_harness, write_config
from tests.gateway.store_helpers import usage
from tokenmill.gateway.config import load_gateway_config, parse_gateway_config
from tokenmill.gateway.errors import GatewayConfigError
from tokenmill.gateway.store import Ledger


def tm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_keys_cli_round_trip(tmp_path):
    db = str(tmp_path / "gw.sqlite3")
    out = tm("gateway", "migrate", "--database", db)
    assert out.returncode == 0 and "schema version 0 ->" in out.stdout, out.stderr
    out = tm("keys", "create", "--database", db, "--name", "ci", "--team", "ml", "--models", "a,b",
             "--rpm", "60", "--budget-usd", "5", "--budget-period", "month", "--metadata", "env=prod",
             "--expires-in", "30d")  # fmt: skip
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    secret, key_id = created["key"], created["id"]
    assert secret.startswith("tm-") and created["models"] == ["a", "b"] and created["rpm"] == 60
    assert created["metadata"] == {"env": "prod"}
    assert iso_seconds(created["expires_at"]) > time.time() + 29 * 86400
    assert abs(iso_seconds(created["created"]) - time.time()) < 60 and created["revoked_at"] is None
    listed = json.loads(tm("keys", "list", "--database", db).stdout)
    assert [k["id"] for k in listed] == [key_id] and secret not in str(listed)
    rotated = json.loads(tm("keys", "rotate", key_id, "--database", db).stdout)["key"]
    assert rotated != secret
    updated = json.loads(tm("keys", "update", key_id, "--database", db, "--rpm", "10").stdout)
    assert updated["rpm"] == 10 and updated["team"] == "ml"
    assert tm("keys", "revoke", key_id, "--database", db).returncode == 0
    assert json.loads(tm("keys", "list", "--database", db).stdout) == []
    [revoked] = json.loads(tm("keys", "list", "--all", "--database", db).stdout)
    assert iso_seconds(revoked["revoked_at"]) >= iso_seconds(revoked["created"])
    shown = json.loads(tm("keys", "show", key_id, "--database", db).stdout)
    assert shown["revoked_at"] == revoked["revoked_at"] and shown["updated"].endswith("Z")
    bad = tm("keys", "create", "--database", db, "--rpm", "0")
    assert bad.returncode == 2 and "rpm" in bad.stderr
    assert tm("keys", "show", "key_missing", "--database", db).returncode == 2
    out = tm("usage", "--database", db, "--json")
    assert out.returncode == 0 and json.loads(out.stdout) == []
    assert secret not in (tmp_path / "gw.sqlite3").read_bytes().decode("latin-1")


def iso_seconds(text: str) -> float:
    """An ISO-8601 UTC time the CLI printed ("2026-01-31T12:00:00Z") as epoch seconds."""
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", text), text
    return datetime.fromisoformat(text).timestamp()


def test_usage_by_key_shows_each_key_s_id_and_name(tmp_path):
    db = str(tmp_path / "gw.sqlite3")
    ids = {}
    for name in ("ci-bot", None):
        made = tm("keys", "create", "--database", db, *(["--name", name] if name else []))
        ids[name] = json.loads(made.stdout)["id"]
    with Ledger.open(db, tmp_path / "journal") as ledger:
        for i, key_id in enumerate([ids["ci-bot"], ids["ci-bot"], ids[None], None]):
            ledger.record(usage(i, key_id=key_id, prompt_tokens=10, cached_tokens=0))
        assert ledger.flush()
    rows = json.loads(tm("usage", "--database", db, "--group-by", "key", "--json").stdout)
    by_id = {r["key_id"]: (r["key_name"], r["requests"], r["prompt_tokens"]) for r in rows}
    assert by_id == {ids["ci-bot"]: ("ci-bot", 2, 20), ids[None]: (None, 1, 10), None: (None, 1, 10)}
    table = tm("usage", "--database", db, "--group-by", "key").stdout
    lines = [re.split(r"\s*[│┃]\s*", line)[1:-1] for line in table.splitlines()]
    cells = {line[0]: line[1:3] for line in lines if line}
    assert cells["key_id"] == ["key_name", "requests"], table
    assert cells[ids["ci-bot"]] == ["ci-bot", "2"], table
    assert cells[ids[None]] == cells["-"] == ["-", "1"], table  # unnamed, and no key at all
    days = tm("usage", "--database", db, "--since", "2026-01-01T00:00:00Z", "--json").stdout
    assert [d["day"] for d in json.loads(days)] == ["2026-01-01"]
    later = tm("usage", "--database", db, "--since", "2026-01-01T01:00:00+01:00", "--json")
    assert json.loads(later.stdout)[0]["requests"] == 4  # 00:00Z: the offset counts


BAD_CONFIGS = [
    ({"databse": "x"}, "databse"),
    ({"prices": {"default": {"input": -1}}}, "prices.default.input"),
    ({"prices": {"m": {"outptu": 1}}}, "prices.m.outptu"),
    ({"defaults": {"rpm": 0}}, "defaults.rpm"),
    ({"defaults": {"rpm": 1.5}}, "defaults.rpm"),
    ({"admin_key_sha256": "abc"}, "admin_key_sha256"),
    ({"tool_policies": {"p": {"allow": "x"}}}, "tool_policies.p.allow"),
    ({"tool_policies": {"p": {"deny_patterns": ["("]}}}, "tool_policies.p.deny_patterns[0]"),
    ({"tool_policies": {"p": {"allwo": []}}}, "tool_policies.p.allwo"),
    ({"default_tool_policy": "nope"}, "default_tool_policy"),
    ({"open_paths": ["health"]}, "open_paths"),
    ({"guardrails": {"rules": [{"name": "r", "scanner": "regex", "pattern": "(", "action": "block"}]}},
     "guardrails.rules[0]"),
    ({"guardrails": {"rules": [{"name": "r", "scanner": "pii", "action": "explode"}]}},
     "guardrails.rules[0].action"),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "where"), BAD_CONFIGS)
def test_config_errors_name_the_key(tmp_path, raw, where):
    with pytest.raises(GatewayConfigError) as err:
        parse_gateway_config(raw, tmp_path)
    assert err.value.path.startswith(where), (err.value.path, where)
    assert where in str(err.value)


YAML_ERRORS = [
    ("guardrails: [oops", "line 1, column 18: expected ',' or ']', but got '<stream end>' "
     "(while parsing a flow sequence from line 1, column 13)"),
    ("defaults:\n  rpm: 60\n  tpm: 1: 2\n", "line 3, column 9: mapping values are not allowed here"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "where"), YAML_ERRORS)
def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path, text, where):
    path = tmp_path / "gw.yaml"
    path.write_text(text)
    with pytest.raises(GatewayConfigError) as err:
        load_gateway_config(path)
    assert str(err.value) == f"gateway config: {path}, {where}"
    out = tm("keys", "list", "--gateway-config", str(path))
    assert (out.returncode, out.stderr) == (2, f"error: gateway config: {path}, {where}\n")


def test_serve_refuses_a_bad_config_before_loading_the_model(tmp_path):
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"defaults": {"tpm": -3}}))
    out = tm("serve", "--gateway-config", str(path))
    assert out.returncode == 2 and "defaults.tpm" in out.stderr


def test_config_reload_applies_new_rules_without_dropping_requests(tmp_path):
    h = make_harness(tmp_path)

    async def main():
        key, _ = await h.new_key()
        async with h.client(key) as c:
            slow = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
                    "x_script": {"pieces": ["Acme Corp"] * 5, "delay": 0.1}}  # fmt: skip
            running = asyncio.ensure_future(c.post("/v1/chat/completions", json=slow))
            await asyncio.sleep(0.1)
            config = yaml.safe_load(h.gateway.config_path.read_text())
            config["guardrails"] = {"rules": [{"name": "acme", "scanner": "deny_list", "terms": ["acme corp"],
                                               "action": "fallback", "fallback": "no."}]}  # fmt: skip
            h.gateway.config_path.write_text(yaml.safe_dump(config))
            assert h.gateway.reload_config()
            first = await running  # started under the old config: untouched
            assert first.status_code == 200 and first.text.count("Acme Corp") == 5
            reply = await c.post(
                "/v1/chat/completions",
                json={**slow, "stream": False, "x_script": {"pieces": ["Acme Corp"]}},
            )
            assert reply.json()["choices"][0]["message"]["content"] == "no."
            # a broken file keeps the running config; so does an empty one (an editor's
            # truncate-then-write save, for a moment), which would turn every rule off
            for broken in ("guardrails: [oops", "", "# nothing yet\n"):
                h.gateway.config_path.write_text(broken)
                assert not h.gateway.reload_config()
                reply = await c.post(
                    "/v1/chat/completions",
                    json={**slow, "stream": False, "x_script": {"pieces": ["Acme Corp"]}},
                )
                assert reply.json()["choices"][0]["message"]["content"] == "no."

    asyncio.run(main())
    h.close()


def test_the_documented_example_config_is_valid(tmp_path):
    from pathlib import Path

    section = (Path(__file__).resolve().parents[2] / "docs" / "gateway.md").read_text()
    example = section[
        section.index("```yaml") + 7 : section.index("```", section.index("```yaml") + 7)
    ]
    config = parse_gateway_config(yaml.safe_load(example), tmp_path, env={})
    assert {r.name for r in config.guardrails.rules} >= {"secrets", "pii", "harmful"}
    assert (
        "support-bot" in config.tool_policies
        and config.price("SmolLM2-135M-Instruct").output == 0.08
    )


def test_a_key_s_tool_policy_must_be_defined_where_it_is_made(tmp_path):
    config = write_config(tmp_path, {"tool_policies": {"strict": {"allow": ["get_weather"]}}})
    made = tm("keys", "create", "--gateway-config", str(config), "--tool-policy", "strict")
    assert made.returncode == 0, made.stderr
    key_id = json.loads(made.stdout)["id"]
    for action in (("create",), ("update", key_id)):
        out = tm("keys", *action, "--gateway-config", str(config), "--tool-policy", "strcit")
        assert out.returncode == 2 and "no policy named 'strcit'" in out.stderr, out.stderr
        assert "strict" in out.stderr  # the defined ones are named
        # without the config the name cannot be checked: refused, not stored unchecked
        db = str(tmp_path / "gateway.sqlite3")
        out = tm("keys", *action, "--database", db, "--tool-policy", "strict")
        assert out.returncode == 2 and "--gateway-config" in out.stderr, out.stderr
    shown = json.loads(tm("keys", "show", key_id, "--gateway-config", str(config)).stdout)
    assert shown["tool_policy"] == "strict"


def test_an_undefined_tool_policy_refuses_every_tool_call():
    from tokenmill.gateway.tool_policy import check_tool_call

    config = parse_gateway_config(
        {"database": "x.sqlite3", "tool_policies": {"open": {}}, "default_tool_policy": "open"}
    )
    assert config.tool_policy(None) is config.tool_policies["open"]  # the default
    gone = config.tool_policy("removed-by-a-reload")
    tools = {"get_weather": {"type": "object"}}
    assert not check_tool_call(gone, tools, "get_weather", "{}").allowed
    assert check_tool_call(config.tool_policy("open"), tools, "get_weather", "{}").allowed
    assert parse_gateway_config({"database": "x.sqlite3"}).tool_policy(None) is None


def test_cli_revoke_reaches_a_running_router(tmp_path):
    """`tokenmill router --gateway-config` as users start it, with no replica up (the key
    check comes first: a live key gets 503 'no healthy replica', a revoked one 401)."""
    import os
    import signal

    import httpx

    from tokenmill.router.cluster import free_port

    config = write_config(tmp_path)
    port = free_port()
    log = tmp_path / "router.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenmill.cli", "router", "--port", str(port),
             "--replica", f"http://127.0.0.1:{free_port()}", "--gateway-config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ},
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1/models"
    try:
        made = json.loads(tm("keys", "create", "--gateway-config", str(config)).stdout)

        def status() -> int | None:
            assert proc.poll() is None, log.read_text()
            try:
                return httpx.get(url, headers={"Authorization": f"Bearer {made['key']}"}).status_code
            except httpx.HTTPError:
                return None

        deadline = time.monotonic() + 60
        while status() != 503:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert tm("keys", "revoke", made["id"], "--gateway-config", str(config)).returncode == 0
        t0 = time.monotonic()
        while status() != 401:
            assert time.monotonic() - t0 < 3.0, log.read_text()
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
