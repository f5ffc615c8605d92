"""A self-contained HTML page for people: the headline first (each target against the
baseline, or each target's main figures), then the plots, the full table, warnings, and the
run's settings folded away at the end."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from tokenmill.bench.report.rows import COLUMNS, flat_summary, fmt, ratio_rows, scenario
from tokenmill.bench.report.tables import busy_runs, table_rows
from tokenmill.bench.results import RunResult
from tokenmill.ui.theme import theme_css

# the page's own layout; colours and fonts come from the web UI's theme.css, embedded
_CSS = """
body{margin:2em}
td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}
tr.ratio{background:#eef6ff;font-style:italic}
img{max-width:48%;margin:6px;border:1px solid var(--border)}
pre{background:var(--panel);padding:8px;font-size:12px;white-space:pre-wrap}
ul.headline{font-size:15px;line-height:1.6}
p.sub{color:var(--muted);margin-top:-0.6em}
details{margin-top:2em}summary{cursor:pointer;font-weight:600}
"""
# (summary key, label, format, higher is better)
_HEADLINE = (
    ("output_throughput", "output tok/s", "{:.1f}", True),
    ("ttft_ms_median", "TTFT median", "{:.0f} ms", False),
    ("tpot_ms_median", "TPOT median", "{:.1f} ms", False),
    ("itl_ms_p99", "ITL p99", "{:.1f} ms", False),
)


def _ratio_span(value: float, higher_is_better: bool) -> str:
    if value != value:  # NaN: no figure on one side
        return "–"
    good = value > 1.0 if higher_is_better else value < 1.0
    cls = "better" if good else "worse" if value != 1.0 else ""
    return f'<span class="{cls}">{value:.2f}x</span>'


def headline(results: list[RunResult], baseline: str | None) -> str:
    """Each target ÷ the baseline per scenario (or, without one, each run's main figures)."""
    items = []
    rows = ratio_rows(results, baseline) if baseline else []
    for row in rows:
        parts = ", ".join(f"{label} {_ratio_span(row[key], up)}" for key, label, _, up in _HEADLINE)
        items.append(
            f"<li><b>{html.escape(row['ratio'])}</b> · {html.escape(row['scenario'])}: {parts}</li>"
        )
    if not rows:
        for r in results:
            flat = flat_summary(r.summary)
            parts = ", ".join(
                f"{label} {html.escape(fmt(flat.get(key), pattern))}"
                for key, label, pattern, _ in _HEADLINE
            )
            items.append(
                f"<li><b>{html.escape(r.target)}</b> · {html.escape(scenario(r))}: {parts}</li>"
            )
    return '<ul class="headline">' + "".join(items) + "</ul>"


def _subtitle(meta: dict[str, Any]) -> str:
    bits = [str(meta.get(k)) for k in ("date", "cpu") if meta.get(k)]
    if meta.get("cores"):
        bits.append(f"{meta['cores']} cores")
    if meta.get("commit"):
        bits.append(f"commit {meta['commit']}")
    return html.escape(" · ".join(bits))


def render_html(
    results: list[RunResult], meta: dict[str, Any], plots: dict[str, Path], baseline: str | None
) -> str:
    head = "".join(
        f"<th>{html.escape(h)}</th>" for h in ["scenario", "target"] + [c[1] for c in COLUMNS]
    )
    body = []
    for scen, label, cells in table_rows(results, baseline):
        cls = ' class="ratio"' if " / " in label else ""
        tds = "".join(f"<td>{html.escape(c)}</td>" for c in [scen, label, *cells])
        body.append(f"<tr{cls}>{tds}</tr>")
    errors = [
        f"<li>{html.escape(r.label)}: {html.escape(str(r.summary.errors))}</li>"
        for r in results
        if r.summary.errors
    ]
    errors += [
        f"<li>{html.escape(r.label)}: other processes used {r.background_cpu:.2f} CPU cores "
        "during the run (numbers not clean)</li>"
        for r in busy_runs(results)
    ]
    imgs = "".join(
        f'<img src="{html.escape(p.name)}" alt="{html.escape(k)}">' for k, p in plots.items()
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>tokenmill bench</title>
<style>{theme_css()}{_CSS}</style></head>
<body>
<h1>tokenmill bench</h1>
<p class="sub">{_subtitle(meta)}</p>
<h2>Headline</h2>
{headline(results, baseline)}
{"<h3>Errors and warnings</h3><ul>" + "".join(errors) + "</ul>" if errors else ""}
<h2>Plots</h2>
{imgs}
<h2>Results</h2>
<table><tr>{head}</tr>{"".join(body)}</table>
<p>TTFT to the first streamed token; TPOT = (E2E − TTFT)/(output tokens − 1); ITL per token
gap; goodput = requests meeting every SLO per second; failed requests are excluded from
latencies and counted in err. Ratio rows divide each target's value by the baseline's
(green: better, red: worse).</p>
<details><summary>Run settings</summary>
<pre>{html.escape(json.dumps(meta, indent=2, default=str))}</pre>
</details>
</body></html>
"""


def write_html(
    out_dir: Path,
    results: list[RunResult],
    meta: dict[str, Any],
    plots: dict[str, Path],
    baseline: str | None = None,
) -> Path:
    path = out_dir / "report.html"
    path.write_text(render_html(results, meta, plots, baseline))
    return path
