"""Report files from hand-made results: JSON, CSV, markdown with ratios, HTML, plots."""

from __future__ import annotations

import csv
import json

import pytest
from rich.console import Console

from tests.bench.fixtures import REC_A, REC_B, REC_C, REC_D
from tokenmill.bench.config import LoadSpec
from tokenmill.bench.execute import RunOptions
from tokenmill.bench.metrics import summarize
from tokenmill.bench.report.plots import pareto_front
from tokenmill.bench.report.rows import ratio_rows
from tokenmill.bench.report.tables import markdown_table
from tokenmill.bench.report.write import write_report
from tokenmill.bench.results import RunResult


def result(target: str, concurrency: int, records) -> RunResult:
    return RunResult(
        target, "random in 8, out 4", LoadSpec("concurrency", concurrency=concurrency),
        summarize(list(records)), tuple(records),
    )  # fmt: skip


@pytest.fixture
def results():
    return [
        result("tokenmill", 1, [REC_A, REC_B]),
        result("llama-server", 1, [REC_A, REC_B, REC_C]),
        result("tokenmill", 4, [REC_A, REC_B, REC_D]),
        result("llama-server", 4, [REC_B, REC_D]),
    ]


def test_ratio_rows(results):
    rows = ratio_rows(results, "llama-server")
    assert [r["ratio"] for r in rows] == ["tokenmill / llama-server"] * 2
    first = rows[0]
    # same successful requests, tokenmill's run ended at 2.2 s vs 3.0 s: 3.0/2.2 the throughput
    assert first["output_throughput"] == pytest.approx(3.0 / 2.2)
    assert first["ttft_ms_median"] == pytest.approx(1.0)


def test_markdown_table_has_targets_and_ratios(results):
    md = markdown_table(results, "llama-server")
    lines = md.splitlines()
    assert lines[0].startswith("| scenario | target | ok | err |")
    assert sum("**tokenmill / llama-server**" in line for line in lines) == 2
    assert len(lines) == 2 + 4 + 2
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_pareto_front():
    pts = [(1.0, 10.0), (2.0, 8.0), (2.0, 5.0), (3.0, 9.0), (4.0, 1.0)]
    assert pareto_front(pts) == [(1.0, 10.0), (3.0, 9.0), (4.0, 1.0)]


def test_write_report(tmp_path, results):
    console = Console(file=open(tmp_path / "console.txt", "w"), width=200)  # noqa: SIM115
    paths = write_report(
        tmp_path, results, [], [], [], RunOptions(), console, baseline="llama-server"
    )
    doc = json.loads((tmp_path / "results.json").read_text())
    assert len(doc["runs"]) == 4 and len(doc["ratios"]) == 2
    run = doc["runs"][1]
    assert run["target"] == "llama-server" and run["load"]["concurrency"] == 1
    assert run["summary"]["failed"] == 1 and run["summary"]["errors"] == {"HTTP 503": 1}
    assert run["summary"]["ttft_ms"]["p99"] is not None
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert len(rows) == 4 and float(rows[0]["output_throughput"]) > 0
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 10
    html = (tmp_path / "report.html").read_text()
    for name in (
        "ttft_cdf",
        "tpot_cdf",
        "e2e_cdf",
        "throughput_vs_concurrency",
        "ttft_vs_load",
        "pareto",
    ):
        png = paths[name]
        assert png.read_bytes()[:4] == b"\x89PNG" and png.name in html
    assert "tokenmill / llama-server" in html
    assert "tokenmill / llama-server" in (tmp_path / "console.txt").read_text()


def test_runs_on_a_busy_machine_are_flagged(tmp_path, results):
    from dataclasses import replace

    busy = [replace(results[0], background_cpu=1.2), *results[1:]]
    console = Console(file=open(tmp_path / "console.txt", "w"), width=200)  # noqa: SIM115
    write_report(tmp_path, busy, [], [], [], RunOptions(), console, plots=False)
    assert "1.20 CPU cores" in (tmp_path / "console.txt").read_text()
    assert "numbers not clean" in (tmp_path / "report.html").read_text()
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["runs"][0]["background_cpu_cores"] == 1.2


def test_report_leads_with_the_headline_and_folds_the_settings(tmp_path, results):
    console = Console(file=open(tmp_path / "console.txt", "w"), width=200)  # noqa: SIM115
    write_report(
        tmp_path, results, [], [], [], RunOptions(), console, baseline="llama-server", plots=False
    )
    page = (tmp_path / "report.html").read_text()
    head = page.index("<h2>Headline</h2>")
    assert head < page.index("<h2>Results</h2>") < page.index("<details><summary>Run settings")
    headline = page[head : page.index("</ul>", head)]
    assert "tokenmill / llama-server" in headline and "output tok/s" in headline
    assert "x</span>" in headline  # ratios, coloured better / worse
    assert page.index("<pre>") > page.index("<details>")  # the settings only inside it
    console = Console(file=open(tmp_path / "c2.txt", "w"), width=200)  # noqa: SIM115
    write_report(tmp_path, results, [], [], [], RunOptions(), console, plots=False)  # no baseline
    page = (tmp_path / "report.html").read_text()
    head = page[page.index("<h2>Headline</h2>") :]
    assert "output tok/s" in head and "TTFT median" in head and " ms" in head
