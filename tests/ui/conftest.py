"""Fixtures of the web UI's browser tests: Debian's Chromium driven by Playwright, a real
`tokenmill serve --api-key` (KV events on, so a router can index it), and pages that fail
their test on any console error or uncaught exception, leaving a screenshot behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.server.conftest import ServerProcess, free_port, start_server
from tests.ui.browser import ARTIFACTS, SAVED, chromium_path, screenshot

KEY = "ui-test-key-0123456789"


@pytest.fixture(scope="package")
def browser():
    path = chromium_path()
    if path is None:
        if os.environ.get("CI") or os.environ.get("TOKENMILL_UI_BROWSER") == "required":
            pytest.fail("no chromium on PATH in CI (scripts/test.sh installs it with apt-get)")
        pytest.skip("no chromium on PATH: `apt-get install chromium` (scripts/test.sh does)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=15_000)  # a loaded 2-core machine: seconds between polls

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        browser = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="package")
def ui_server(tmp_path_factory) -> Iterator[ServerProcess]:
    events, replay = free_port(), free_port()
    srv = start_server(
        tmp_path_factory.mktemp("ui-server"),
        "--api-key", KEY, "--max-num-seqs", "8",
        "--kv-events-endpoint", f"tcp://127.0.0.1:{events}",
        "--kv-events-replay-endpoint", f"tcp://127.0.0.1:{replay}",
    )  # fmt: skip
    srv.events = (f"tcp://127.0.0.1:{events}", f"tcp://127.0.0.1:{replay}")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


class Problems(list):
    """Console errors and uncaught page exceptions, as text."""


@pytest.fixture
def page(browser, request) -> Iterator:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    problems = Problems()
    page.on(
        "console",
        lambda m: (
            problems.append(f"console {m.type}: {m.text} ({m.location})")
            if m.type == "error"
            else None
        ),
    )
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.problems = problems
    yield page
    screenshot(page, request.node.name)
    context.close()
    assert not problems, f"the page reported errors: {problems}"


def pytest_terminal_summary(terminalreporter) -> None:
    if SAVED:
        terminalreporter.write_line(f"web UI screenshots ({len(SAVED)}): {ARTIFACTS}")


def open_ui(page, url: str, key: str = KEY) -> None:
    """Opens a UI page, gives the key when it asks, and waits until the page is ready."""
    page.goto(url)
    page.locator("#key-input").fill(key)
    page.locator("#key-save").click()
    page.wait_for_selector("body[data-ready=true]", timeout=30_000)
