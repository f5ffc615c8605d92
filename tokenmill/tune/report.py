"""The tune's HTML report: the frontier plot, the chosen point and its gain over the
defaults, the run-to-run spread of the chosen point, every trial with its settings and
figures, and the commands that reproduce it."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from tokenmill.tune.frontier import pareto_frontier
from tokenmill.tune.space import config_argv, launch_command
from tokenmill.tune.trials import Trial


@dataclass(frozen=True)
class TuneOutcome:
    trials: dict[str, Trial]  # per configuration, its runs combined (TrialStore.measured)
    attempts: dict[str, list[Trial]]  # every attempt per configuration
    defaults_key: str
    chosen_key: str | None
    workload: str
    slo: str
    attainment: float
    command: str
    config_path: Path | None

    def gain(self) -> tuple[float, float] | None:
        """(total, per-user) throughput of the chosen point over the defaults'."""
        base = self.trials.get(self.defaults_key)
        if self.chosen_key is None or base is None or not base.total or not base.per_user:
            return None
        c = self.trials[self.chosen_key]
        return c.total / base.total, c.per_user / base.per_user

    def spread(self) -> tuple[float, float, int] | None:
        """(min, max) total tok/s of the chosen point over its attempts, and their count."""
        if self.chosen_key is None:
            return None
        totals = [t.total for t in self.attempts[self.chosen_key]]
        return min(totals), max(totals), len(totals)


def frontier_plot(outcome: TuneOutcome, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = list(outcome.trials.values())
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for clean, marker in ((True, "o"), (False, "x")):
        pts = [t for t in trials if t.clean == clean]
        if not pts:
            continue
        ax.scatter([t.per_user for t in pts], [t.total for t in pts], marker=marker, s=28,
                   color="#6b7a90", label="trial" if clean else "trial (busy machine)")  # fmt: skip
    front = pareto_frontier([t.point() for t in trials])
    ax.plot([p.per_user for p in front], [p.total for p in front], "-", color="#1f6feb",
            label="Pareto frontier")  # fmt: skip
    base = outcome.trials.get(outcome.defaults_key)
    if base is not None:
        ax.scatter([base.per_user], [base.total], s=90, facecolors="none", edgecolors="#d1242f",
                   linewidths=2, label="defaults")  # fmt: skip
    if outcome.chosen_key is not None:
        c = outcome.trials[outcome.chosen_key]
        ax.scatter([c.per_user], [c.total], marker="*", s=220, color="#1a7f37", label="chosen")
    ax.set_xlabel("per-user output tok/s")
    ax.set_ylabel("total output tok/s")
    ax.set_title(outcome.workload, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _num(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.{digits}f}"


def write_report(outcome: TuneOutcome, out_dir: Path) -> Path:
    plot = frontier_plot(outcome, out_dir / "frontier.png")
    front = {p.key for p in pareto_frontier([t.point() for t in outcome.trials.values()])}
    rows = []
    ordered = sorted(outcome.trials.values(), key=lambda t: (-t.total, t.key))
    for t in ordered:
        flags = " ".join(config_argv(t.config)) or "(defaults)"
        marks = " ".join(
            m
            for m, on in (
                ("chosen", t.key == outcome.chosen_key),
                ("defaults", t.key == outcome.defaults_key),
                ("frontier", t.key in front),
                ("busy machine", not t.clean),
            )
            if on
        )
        f = t.figures
        rows.append(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
                flags, _num(t.per_user), _num(t.total), _num(f.get("ttft_ms_p50"), 0),
                _num(f.get("ttft_ms_p99"), 0), _num(f.get("tpot_ms_p50")),
                _num(t.slo_attainment, 2), _num(t.background_cores, 2),
                len(outcome.attempts.get(t.key, [])), marks,
            )) + "</tr>"
        )  # fmt: skip
    if outcome.chosen_key is None:
        headline = "<p><b>No configuration met the SLO</b> on a clean measurement.</p>"
    else:
        chosen = outcome.trials[outcome.chosen_key]
        gain = outcome.gain()
        spread = outcome.spread()
        headline = (
            f"<p><b>Chosen:</b> <code>{html.escape(' '.join(config_argv(chosen.config)) or '(defaults)')}"
            f"</code> — {_num(chosen.total)} total / {_num(chosen.per_user)} per-user output "
            f"tok/s, SLO attainment {_num(chosen.slo_attainment, 2)}.</p>"
        )
        if gain is not None:
            headline += (
                f"<p><b>Over the defaults:</b> {gain[0]:.2f}x total, {gain[1]:.2f}x per-user "
                "throughput.</p>"
            )
        if spread is not None:
            headline += (
                f"<p><b>Run-to-run spread of the chosen point:</b> {_num(spread[0])}..."
                f"{_num(spread[1])} total tok/s over {spread[2]} runs.</p>"
            )
    command = "serve"
    if outcome.chosen_key is not None and outcome.chosen_key in outcome.trials:
        command = launch_command(outcome.trials[outcome.chosen_key].config)
    serve = (
        f"tokenmill {command} --config {html.escape(str(outcome.config_path))}"
        if outcome.config_path
        else "–"
    )
    head = (
        "<th>flags</th><th>per-user tok/s</th><th>total tok/s</th><th>TTFT p50 ms</th>"
        "<th>TTFT p99 ms</th><th>TPOT p50 ms</th><th>SLO attainment</th>"
        "<th>background cores</th><th>runs</th><th></th>"
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>tokenmill tune</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:72em}}
table{{border-collapse:collapse;font-size:.9em}}td,th{{border:1px solid #ccc;padding:.25em .5em;
text-align:right}}td:first-child{{text-align:left;font-family:monospace}}</style></head><body>
<h1>tokenmill tune</h1>
<p>{html.escape(outcome.workload)} · SLO {html.escape(outcome.slo or "none")} met by
≥ {outcome.attainment:.0%} of requests</p>
{headline}
<img src="{plot.name}" alt="latency/throughput frontier">
<h2>Reproduce</h2><pre>{html.escape(outcome.command)}
{serve}</pre>
<h2>Trials</h2><table><tr>{head}</tr>{"".join(rows)}</table>
</body></html>
"""
    path = out_dir / "report.html"
    path.write_text(page)
    return path
