"""The dashboard in Chromium: its charts follow a real `tokenmill bench` run against the
server (the server's own sampled metrics, polled every second)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

from playwright.sync_api import expect

from tests.ui.browser import screenshot
from tests.ui.conftest import KEY, open_ui

NUM_REQUESTS = 6  # x 160 output tokens: seconds of decoding, sampled once a second


def _card(page, label: str) -> str:
    return (
        page.locator(".card", has=page.locator(".label", has_text=label))
        .locator(".value")
        .inner_text()
    )


def test_the_charts_follow_a_bench_run(page, ui_server, tmp_path):
    open_ui(page, ui_server.base_url + "/ui/dashboard")
    for chart in ("requests", "kv", "prefix", "throughput", "ttft", "itl", "events"):
        expect(page.locator(f"#chart-{chart}")).to_have_attribute(
            "data-points", re.compile(r"[1-9]")
        )
    done_before = int(_card(page, "requests done").replace(",", ""))
    points_before = int(page.locator("#chart-throughput").get_attribute("data-points"))

    bench = subprocess.Popen(
        [sys.executable, "-m", "tokenmill.cli", "bench", "--base-url", ui_server.base_url,
         "--api-key", KEY, "--endpoint", "chat", "--concurrency", "4",
         "--num-requests", str(NUM_REQUESTS), "--input-len", "32", "--output-len", "160",
         "--warmup", "0", "--no-plots", "--no-progress", "--output-dir", str(tmp_path / "bench")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen_output, points = 0.0, []
    while bench.poll() is None:
        seen_output = max(seen_output, float(_card(page, "output tok/s").replace(",", "")))
        points.append(int(page.locator("#chart-throughput").get_attribute("data-points")))
        time.sleep(0.3)
    out = bench.communicate()[0]
    assert bench.returncode == 0, out
    # the page polls once a second and may trail the sampler on a loaded machine (the output
    # rate it shows spans the sampler's last seconds, the bench's end included)
    deadline = time.monotonic() + 10
    while True:
        running_max = float(page.locator("#chart-requests").get_attribute("data-max"))
        seen_output = max(seen_output, float(_card(page, "output tok/s").replace(",", "")))
        if (running_max >= 1 and seen_output > 0) or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert running_max >= 1, "the requests chart shows the bench's running requests"
    assert seen_output > 0, "output tok/s rose while the bench ran"
    assert len(set(points)) >= 2 and points[-1] >= points_before, f"charts updated live: {points}"
    # every bench request shows up in the server's counts within a couple of samples
    expect(
        page.locator(".card", has=page.locator(".label", has_text="requests done"))
    ).to_contain_text(str(done_before + NUM_REQUESTS), timeout=10_000)
    expect(page.locator("#chart-ttft .legend")).to_contain_text("p99")
    assert float(page.locator("#chart-ttft").get_attribute("data-max")) > 0
    page.select_option("#span", "60")  # the last minute: the run fills the picture
    screenshot(page, "ui-dashboard")

    report = (tmp_path / "bench" / "report.html").read_text()
    assert "--series-1" in report, "the bench report carries the UI's theme"
