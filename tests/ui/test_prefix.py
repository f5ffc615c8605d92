"""The UI behind a reverse proxy at a sub-path (/tm/...): the pages use relative URLs only,
so every request they make stays under the prefix, and chat streams through it (in
JSON-schema mode)."""

from __future__ import annotations

import json
import re

from playwright.sync_api import expect

from tests.ui.conftest import open_ui
from tests.ui.prefix_proxy import PrefixProxy

SCHEMA = {
    "type": "object",
    "properties": {"colour": {"type": "string", "enum": ["red", "blue"]}},
    "required": ["colour"],
    "additionalProperties": False,
}


def test_the_ui_works_under_a_path_prefix(page, ui_server):
    with PrefixProxy(ui_server.base_url, "/tm") as proxy:
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        open_ui(page, proxy.url + "/ui")
        assert page.url == proxy.url + "/ui/"
        page.select_option("#mode", "json_schema")  # and JSON-schema mode, while here
        page.fill("#schema", json.dumps(SCHEMA))
        page.fill("#max_tokens", "20")
        page.fill("#temperature", "0")  # sampled at 0.7, JSON whitespace could use up the 20
        page.fill("#prompt", "Pick a colour.")
        page.click("#send")
        expect(page.locator("#messages article.assistant .stat-finish")).to_have_text(
            "finish: stop", timeout=60_000
        )
        reply = json.loads(page.locator("#messages article.assistant .body").inner_text())
        assert reply["colour"] in ("red", "blue")
        page.click("text=Dashboard")
        page.wait_for_selector("body[data-polls]")
        expect(page.locator("#chart-requests")).to_have_attribute(
            "data-points", re.compile(r"^[1-9]")
        )
        page.click("text=Playground")
        page.wait_for_selector("body[data-ready=true]")
    assert requested, "the pages made requests"
    outside = [u for u in requested if not u.startswith(proxy.url + "/")]
    assert not outside, f"requests outside the prefix: {outside}"
    assert all(p.startswith("/tm/") for p in proxy.seen), proxy.seen
