"""The router's dashboard in Chromium, with the gateway in front: replicas and their health,
placement decisions with reasons, index size per replica and tier, and (admin key only) the
gateway's keys, spend per key, guardrail decisions and tool-call audit log."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from playwright.sync_api import expect

from tests.server.conftest import MODEL, free_port
from tests.ui.browser import screenshot
from tests.ui.conftest import KEY, open_ui

ADMIN = "admin-" + "u" * 40


@pytest.fixture(scope="module")
def router(ui_server, tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("ui-router")
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "admin_key_sha256": hashlib.sha256(ADMIN.encode()).hexdigest(),
        "database": str(tmp / "gw.sqlite3"),
        "journal": str(tmp / "journal"),
        "prices": {"default": {"input": 0.5, "cached_input": 0.25, "output": 1.5}},
        "guardrails": {"rules": [{"name": "competitor", "scanner": "deny_list",
                                  "terms": ["acme corp"], "action": "block", "stages": ["input"]}]},
    }))  # fmt: skip
    port = free_port()
    events, replay = ui_server.events
    log = tmp / "router.log"
    cmd = [sys.executable, "-m", "tokenmill.cli", "router", "--port", str(port),
           "--replica", f"{ui_server.base_url},{events},{replay}", "--api-key", KEY,
           "--gateway-config", str(config), "--health-interval", "0.5"]  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_router_dashboard_shows_replicas_decisions_and_the_gateway(page, router):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    created = httpx.post(router + "/admin/keys", json={"name": "ui-team-key"}, headers=admin)
    assert created.status_code == 201, created.text
    user = {"Authorization": f"Bearer {created.json()['key']}"}
    chat = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    ok = httpx.post(router + "/v1/chat/completions", headers=user, timeout=120,
                    json={**chat, "messages": [{"role": "user", "content": "Say hi. " * 12}]})  # fmt: skip
    assert ok.status_code == 200, ok.text
    blocked = httpx.post(router + "/v1/chat/completions", headers=user, timeout=60,
                         json={**chat, "messages": [{"role": "user", "content": "acme corp?"}]})  # fmt: skip
    assert blocked.status_code == 400, blocked.text
    assert httpx.get(router + "/ui/api/series", headers=user).status_code == 200
    assert httpx.get(router + "/ui/api/series").status_code == 401

    open_ui(page, router + "/ui/dashboard", ADMIN)
    expect(page).to_have_title("tokenmill · router dashboard")
    replicas = page.locator("#replicas tbody tr")
    expect(replicas).to_have_count(1)
    expect(replicas.first).to_contain_text("healthy")
    expect(replicas.first).to_contain_text("synced")
    device_blocks = replicas.first.locator("td").nth(4)
    expect(device_blocks).not_to_have_text("0")  # the index holds the replica's blocks
    expect(page.locator("#decisions tbody tr").first).to_contain_text("127.0.0.1")
    assert page.locator("#decisions tbody tr").first.locator("td").nth(2).inner_text()  # reason
    for chart in ("in-flight", "decisions", "index", "router-ttft"):
        expect(page.locator(f"#chart-{chart} svg")).to_be_attached()
    expect(page.locator("#gateway-keys")).to_contain_text("ui-team-key")
    expect(page.locator("#gateway-spend tbody tr").first).to_contain_text("ui-team-key")
    expect(page.locator("#gateway-guardrails")).to_contain_text("competitor")
    expect(page.locator("#gateway-guardrails")).to_contain_text("block")
    expect(page.locator("#gateway-tool-calls")).to_be_attached()
    page.select_option("#span", "60")  # the last minute: the run fills the picture
    screenshot(page, "ui-router-dashboard")

    # a plain gateway key sees the charts, not the keys or the audit logs
    page.evaluate("sessionStorage.clear()")
    open_ui(page, router + "/ui/dashboard", user["Authorization"].split()[1])
    expect(page.locator("#replicas")).to_be_attached()
    expect(page.locator("#panels")).to_contain_text("admin key")
    assert page.locator("#gateway-keys").count() == 0
