"""The UI's HTTP side without a browser or a model: the files it serves and their headers
(CSP, no CORS), the key in front of its data, the sampler's ring and windowed percentiles."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Counter, Histogram

from tokenmill.server.auth import APIKeyMiddleware
from tokenmill.ui.histogram import percentiles, quantile, window
from tokenmill.ui.readings import Reading
from tokenmill.ui.recent import RecentValues, recent_percentiles
from tokenmill.ui.routes import add_ui_routes
from tokenmill.ui.sampler import Sampler, SamplerConfig
from tokenmill.ui.server_source import ServerSource
from tokenmill.ui.static_files import STATIC_DIR, StaticUI
from tokenmill.ui.theme import series_colours

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def app_with_key(key: str | None = "k") -> tuple[TestClient, Sampler, Clock]:
    from tokenmill.server.metrics import ServerMetrics

    metrics = ServerMetrics("m")
    clock = Clock()
    sampler = Sampler(ServerSource(metrics.registry), SamplerConfig(), clock)
    sampler.metrics = metrics
    app = FastAPI()
    add_ui_routes(app, sampler, lambda: {"kind": "server"})
    if key:
        app.add_middleware(APIKeyMiddleware, api_key=key, open_paths=("/health",))
    app.add_middleware(StaticUI, key_required=key is not None)
    return TestClient(app, follow_redirects=False), sampler, clock


def test_pages_load_without_the_key_with_a_strict_policy_and_data_needs_it():
    client, _, _ = app_with_key("k")
    redirect = client.get("/ui")
    assert redirect.status_code == 307 and redirect.headers["location"] == "ui/"  # relative
    for path in ("/ui/", "/ui/dashboard", "/ui/static/js/playground.js", "/ui/static/css/app.css"):
        reply = client.get(path, headers={"Origin": "https://evil.example"})
        assert reply.status_code == 200, path
        csp = reply.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert "access-control-allow-origin" not in reply.headers  # no CORS
    assert (
        client.get("/ui/static/js/playground.js")
        .headers["content-type"]
        .startswith("text/javascript")
    )
    assert client.get("/ui/auth").json() == {"key_required": True}
    assert client.get("/ui/static/../api.py").status_code == 401  # not a UI file: the key
    for path in ("/ui/api/info", "/ui/api/series"):
        assert client.get(path).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer k"}).status_code == 200
    preflight = client.options(
        "/ui/api/series",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
    )
    assert "access-control-allow-origin" not in preflight.headers
    open_client, _, _ = app_with_key(None)
    assert open_client.get("/ui/auth").json() == {"key_required": False}


def test_pages_use_relative_urls_only():
    """Behind a proxy at a sub-path an absolute path ('/v1/...') would leave the prefix."""
    absolute = re.compile(
        r"""(?:href|src)=["']/|fetch\(\s*["'`]/|getJSON\(\s*["'`]/|https?://(?!www\.w3\.org)"""
    )
    for path in [*STATIC_DIR.glob("*.html"), *STATIC_DIR.glob("js/*.js")]:
        text = path.read_text()
        assert not absolute.search(text), f"{path.name}: {absolute.search(text).group(0)}"
        assert "innerHTML" not in text, f"{path.name}: builds HTML from strings"


def test_no_inline_script_or_style_in_the_pages():
    for page in STATIC_DIR.glob("*.html"):
        text = page.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), page.name
        assert "<style" not in text and " style=" not in text, page.name
        assert not re.search(r"\son[a-z]+\s*=", text), f"{page.name}: inline event handler"


def test_series_samples_the_servers_own_metrics_every_tick():
    client, sampler, clock = app_with_key("k")
    m = sampler.metrics
    auth = {"Authorization": "Bearer k"}
    sampler.tick()
    m.generation_tokens.labels("m").inc(45)  # + the five first tokens below
    m.running.labels("m").set(3)
    for s in (0.1, 0.2, 0.3, 0.4, 2.0):
        first_token(m, s)
    clock.t += 1.0
    sampler.tick()
    reply = client.get("/ui/api/series", headers=auth).json()
    assert reply["interval_s"] == 1.0 and len(reply["samples"]) == 2
    last = reply["samples"][-1]
    assert last["running"] == 3 and last["output_tps"] == 50.0
    assert last["ttft_ms"]["p50"] == pytest.approx(300) and last["ttft_ms"]["p99"] > 1900
    assert last["kv_usage"] == {"device": 0.0}
    newer = client.get(f"/ui/api/series?since={last['t']}", headers=auth).json()
    assert newer["samples"] == []
    assert client.get("/ui/api/series?since=abc", headers=auth).status_code in (400, 422)


def first_token(metrics, seconds: float, now: float = 100.0) -> None:
    """A request's first token, `seconds` after it arrived (the engine's observer call)."""
    from tokenmill.engine.async_llm import RequestTiming

    metrics.on_tokens(RequestTiming(arrival=now - seconds, num_prompt_tokens=8), 1, now)


# what the benchmark measured: every TTFT between 1.10 and 1.25 s (one 1.0-2.5 s bucket)
TTFTS = [1.100 + 0.151 * (i * 37 % 100) / 99 for i in range(100)]


def exact_ms(values: list[float]) -> dict[str, float]:
    import numpy as np  # the benchmark's percentiles

    p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
    return {"p50": p50 * 1000, "p90": p90 * 1000, "p99": p99 * 1000}


def test_server_ttft_percentiles_are_the_requests_own_within_the_window():
    from tokenmill.server.metrics import ServerMetrics

    metrics, clock = ServerMetrics("m"), Clock()
    metrics.registry.recent_ttft.clock = clock
    sampler = Sampler(ServerSource(metrics.registry), SamplerConfig(window_s=60), clock)
    sampler.tick()
    for s in TTFTS:
        first_token(metrics, s)
    clock.t += 1
    shown = sampler.tick()["ttft_ms"]
    assert shown == pytest.approx(exact_ms(TTFTS), abs=0.01) and shown["p99"] <= 1251
    buckets = Reading.of(metrics.registry).buckets("tokenmill:time_to_first_token_seconds")
    assert percentiles(buckets, 1000)["p50"] > 1700  # what the histogram alone reads
    for _ in range(61):  # a minute on: those requests left the window
        clock.t += 1
        sampler.tick()
    clock.t += 1
    assert sampler.tick()["ttft_ms"] is None
    first_token(metrics, 0.2)
    clock.t += 1
    assert sampler.tick()["ttft_ms"] == {"p50": 200.0, "p90": 200.0, "p99": 200.0}


def test_router_ttft_percentiles_are_the_requests_own():
    from tokenmill.router.config import RouterConfig
    from tokenmill.router.replicas import ReplicaSpec
    from tokenmill.router.router import Router
    from tokenmill.router.ui_source import RouterSource

    router = Router(RouterConfig(), [ReplicaSpec.parse("http://127.0.0.1:9000")])
    clock = Clock()
    router.metrics.recent_ttft.clock = clock
    sampler = Sampler(RouterSource(router, lambda: 0), SamplerConfig(), clock)
    sampler.tick()
    for s in TTFTS:
        router.metrics.observe_ttft(s)
    clock.t += 1
    assert sampler.tick()["ttft_ms"] == pytest.approx(exact_ms(TTFTS), abs=0.01)


def test_recent_values_are_bounded():
    recent = RecentValues(maxlen=3, clock=Clock())
    for v in range(5):
        recent.add(float(v))
    assert recent.within(None) == [2.0, 3.0, 4.0]
    assert recent_percentiles(RecentValues(), None) is None


def test_the_ring_is_bounded_and_percentiles_use_the_window_only():
    registry = CollectorRegistry()
    latency = Histogram("lat_seconds", "x", buckets=(0.1, 1.0, 10.0), registry=registry)
    hits = Counter("hits", "x", registry=registry)

    class Source:
        def read(self):
            return Reading.of(registry)

        def sample(self, now, rate, window_base):
            from tokenmill.ui.rates import per_second, window_percentiles

            return {
                "p": window_percentiles(now, window_base, "lat_seconds", scale=1.0),
                "hits_ps": per_second(now, rate, "hits_total"),
            }

    clock = Clock()
    sampler = Sampler(
        Source(), SamplerConfig(interval_s=1, keep_s=30, rate_s=2, window_s=10), clock
    )
    for _ in range(8):  # slow requests, long ago
        latency.observe(5.0)
    for _ in range(40):
        clock.t += 1
        sampler.tick()
    assert len(sampler.samples) == 30
    assert sampler.samples[-1]["p"] is None, "nothing observed within the window"
    for _ in range(10):
        latency.observe(0.05)
    hits.inc(6)
    clock.t += 1
    last = sampler.tick()
    assert last["p"]["p99"] <= 0.1, "old slow requests left the window"
    assert last["hits_ps"] == 3.0  # 6 over the 2 s rate window


def test_histogram_quantile_matches_prometheus():
    buckets = ((0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0))
    assert quantile(0.25, buckets) == pytest.approx(0.1)
    assert quantile(0.5, buckets) == pytest.approx(0.3)
    assert quantile(0.99, ((1.0, 0.0), (math.inf, 5.0))) == 1.0  # +Inf: the last finite bound
    assert quantile(0.5, ((1.0, 0.0), (math.inf, 0.0))) is None
    assert window(((1.0, 5.0), (math.inf, 7.0)), ((1.0, 2.0), (math.inf, 2.0))) == (
        (1.0, 3.0),
        (math.inf, 5.0),
    )
    assert percentiles(buckets, 1000)["p50"] == pytest.approx(300.0)


def test_the_bench_report_shares_the_theme():
    from tokenmill.bench.report.html import render_html

    page = render_html([], {"date": "today"}, {}, None)
    assert (STATIC_DIR / "css" / "theme.css").read_text() in page
    assert series_colours()[0] in page and len(series_colours()) == 6


def test_the_static_files_and_licences_ship_in_the_package():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["tokenmill"]
    package = REPO / "tokenmill"
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    for path in STATIC_DIR.rglob("*"):
        if path.is_file():
            assert path in shipped, f"{path.relative_to(package)} is not package data"
    for library in ("marked", "dompurify"):
        assert (STATIC_DIR / "vendor" / library / "LICENSE").is_file()


def test_kv_usage_is_charted_per_tier():
    from tokenmill.server.metrics import ServerMetrics
    from tokenmill.stats import SchedulerStats

    metrics = ServerMetrics("m")
    tiers = {
        "host": {"used_bytes": 50, "capacity_bytes": 200},
        "disk": {"used_bytes": 0, "capacity_bytes": 10},
    }
    metrics.on_scheduler_stats(SchedulerStats(kv_cache_usage=0.5, kv_tiers=tiers))
    sampler = Sampler(ServerSource(metrics.registry))
    assert sampler.tick()["kv_usage"] == {"device": 0.5, "host": 0.25, "disk": 0.0}
