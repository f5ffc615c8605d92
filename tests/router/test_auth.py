"""The router's API key: where it comes from, what it guards, what replicas are sent."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from tests.router.fakes import BODY, OK_JSON, serve
from tokenmill.cli import build_parser
from tokenmill.router import cluster
from tokenmill.router.auth import API_KEY_ENV, bearer_matches, resolve_api_key

KEY = "sk-router-7"
GUARDED = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/reset_prefix_cache"),
    ("GET", "/router_info"),
]


def test_key_from_flag_file_or_environment(tmp_path):
    path = tmp_path / "key"
    path.write_text(KEY + "\n")
    assert resolve_api_key(KEY, None, {}) == KEY
    assert resolve_api_key(None, str(path), {API_KEY_ENV: "other"}) == KEY
    assert resolve_api_key(None, None, {API_KEY_ENV: KEY}) == KEY
    assert resolve_api_key(KEY, None, {API_KEY_ENV: "other"}) == KEY  # the flag wins
    assert resolve_api_key(None, None, {}) is None
    with pytest.raises(ValueError, match="not both"):
        resolve_api_key(KEY, str(path), {})
    path.write_text("\n")
    with pytest.raises(ValueError, match="api-key-file"):
        resolve_api_key(None, str(path), {})
    with pytest.raises(ValueError, match=API_KEY_ENV):
        resolve_api_key(None, None, {API_KEY_ENV: ""})


def test_bearer_comparison():
    assert bearer_matches(b"Bearer " + KEY.encode(), KEY.encode())
    assert bearer_matches(b"bearer " + KEY.encode(), KEY.encode())
    wrong = [b"", b"Bearer", b"Bearer ", b"Basic " + KEY.encode(), b"Bearer " + KEY[:-1].encode()]
    for bad in [*wrong, b"Bearer " + KEY.encode() + b"7", b"Bearer  " + KEY.encode()]:
        assert not bearer_matches(bad, KEY.encode()), bad


def test_router_and_cluster_flags(tmp_path):
    path = tmp_path / "key"
    path.write_text(KEY)
    args = build_parser().parse_args(
        ["router", "--replica", "h:1", "--api-key-file", str(path), "--protect-metrics"]
    )
    assert resolve_api_key(args.api_key, args.api_key_file) == KEY and args.protect_metrics
    args = build_parser().parse_args(["cluster", "--api-key", KEY])
    assert args.api_key == KEY and not args.protect_metrics


@pytest.mark.anyio
@pytest.mark.parametrize("method,path", GUARDED)
async def test_guarded_endpoints_need_the_key(method, path):
    def handler(name, request):
        return httpx.Response(200, json=OK_JSON)

    async with serve(handler, api_key=KEY) as fake:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
            r = await fake.client.request(method, path, json=BODY, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert r.json() == {
                "error": {
                    "message": "Incorrect or missing API key.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        r = await fake.client.request(
            method, path, json=BODY, headers={"authorization": f"Bearer {KEY}"}
        )
        assert r.status_code == 200, path


@pytest.mark.anyio
async def test_health_and_metrics_open_unless_metrics_protected():
    async with serve(lambda n, r: httpx.Response(200), api_key=KEY) as fake:
        assert (await fake.client.get("/health")).status_code == 200
        assert (await fake.client.get("/version")).status_code == 200
        assert (await fake.client.get("/metrics")).status_code == 200
    async with serve(lambda n, r: httpx.Response(200), api_key=KEY, protect_metrics=True) as fake:
        assert (await fake.client.get("/health")).status_code == 200
        assert (await fake.client.get("/metrics")).status_code == 401
        auth = {"authorization": f"Bearer {KEY}"}
        assert (await fake.client.get("/metrics", headers=auth)).status_code == 200


@pytest.mark.anyio
async def test_replicas_get_the_router_key_or_else_the_clients_header():
    sent: list[str | None] = []

    def handler(name, request):
        sent.append(request.headers.get("authorization"))
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"tokens": [1]})
        return httpx.Response(200, json=OK_JSON)

    async with serve(handler, api_key=KEY) as fake:
        auth = {"authorization": f"bearer {KEY}"}
        for path in ("/v1/completions", "/tokenize", "/reset_prefix_cache"):
            assert (await fake.client.post(path, json=BODY, headers=auth)).status_code == 200
        assert sent and set(sent) == {f"Bearer {KEY}"}
    sent.clear()
    async with serve(handler) as fake:  # no key of its own: replicas decide
        auth = {"authorization": "Bearer client-key"}
        assert (
            await fake.client.post("/v1/completions", json=BODY, headers=auth)
        ).status_code == 200
        assert (await fake.client.post("/v1/completions", json=BODY)).status_code == 200
        assert sent == ["Bearer client-key", None]


def test_cluster_gives_replicas_the_key_in_the_environment(tmp_path, monkeypatch):
    seen: dict = {}

    class Proc:
        def __init__(self, cmd, env, **_):
            seen["cmd"], seen["env"] = cmd, env

    monkeypatch.setattr(subprocess, "Popen", Proc)
    monkeypatch.setenv(API_KEY_ENV, "inherited")
    cluster.start_replica([], tmp_path, 1, api_key=KEY)
    assert seen["env"][API_KEY_ENV] == KEY and not any(KEY in a for a in seen["cmd"])
    cluster.start_replica([], tmp_path, 1)
    assert API_KEY_ENV not in seen["env"]  # only the key it is given
