"""A self-contained HTML page: run settings, the results table with ratios, the plots."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from tokenmill.bench.report.rows import COLUMNS
from tokenmill.bench.report.tables import busy_runs, table_rows
from tokenmill.bench.results import RunResult

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}
tr.ratio{background:#eef6ff;font-style:italic}
img{max-width:48%;margin:6px;border:1px solid #eee}
pre{background:#f6f6f6;padding:8px;font-size:12px;white-space:pre-wrap}
"""


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
<html><head><meta charset="utf-8"><title>tokenmill bench</title><style>{_CSS}</style></head>
<body>
<h1>tokenmill bench</h1>
<pre>{html.escape(json.dumps(meta, indent=2, default=str))}</pre>
<h2>Results</h2>
<table><tr>{head}</tr>{"".join(body)}</table>
{"<h3>Errors and warnings</h3><ul>" + "".join(errors) + "</ul>" if errors else ""}
<p>TTFT to the first streamed token; TPOT = (E2E − TTFT)/(output tokens − 1); ITL per token
gap; goodput = requests meeting every SLO per second; failed requests are excluded from
latencies and counted in err. Ratio rows divide each target's value by the baseline's.</p>
<h2>Plots</h2>
{imgs}
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
