"""The UI behind a reverse proxy at a sub-path (/tm/...): the pages use relative URLs only,
so every request they make stays under the prefix, and chat streams through it."""

from __future__ import annotations

from playwright.sync_api import expect

from tests.ui.conftest import open_ui
from tests.ui.prefix_proxy import PrefixProxy


def test_the_ui_works_under_a_path_prefix(page, ui_server):
    with PrefixProxy(ui_server.base_url, "/tm") as proxy:
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        open_ui(page, proxy.url + "/ui")
        assert page.url == proxy.url + "/ui/"
        page.fill("#max_tokens", "6")
        page.fill("#prompt", "Hello!")
        page.click("#send")
        expect(page.locator("#messages article.assistant .stat-finish")).to_be_visible(
            timeout=60_000
        )
        page.click("text=Dashboard")
        page.wait_for_selector("body[data-polls]")
        expect(page.locator("#chart-requests")).to_have_attribute("data-points", _nonzero())
        page.click("text=Playground")
        page.wait_for_selector("body[data-ready=true]")
    assert requested, "the pages made requests"
    outside = [u for u in requested if not u.startswith(proxy.url + "/")]
    assert not outside, f"requests outside the prefix: {outside}"
    assert all(p.startswith("/tm/") for p in proxy.seen), proxy.seen


def _nonzero():
    import re

    return re.compile(r"^[1-9]")
