"""PNG plots (matplotlib, Agg): latency CDFs, throughput vs concurrency, TTFT vs load,
and the Pareto frontier of per-user tokens/s vs total tokens/s."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tokenmill.bench.metrics import itl_gaps_s, tpot_s  # noqa: E402
from tokenmill.bench.record import RequestRecord  # noqa: E402
from tokenmill.bench.results import RunResult  # noqa: E402
from tokenmill.ui.theme import matplotlib_style  # noqa: E402

Getter = Callable[[RequestRecord], list[float]]


def _ttft(r: RequestRecord) -> list[float]:
    return [r.ttft_s * 1000.0] if r.ttft_s is not None else []


def _tpot(r: RequestRecord) -> list[float]:
    t = tpot_s(r)
    return [t * 1000.0] if t is not None else []


def _e2e(r: RequestRecord) -> list[float]:
    return [r.latency_s * 1000.0]


def _itl(r: RequestRecord) -> list[float]:
    return [g * 1000.0 for g in itl_gaps_s(r)]


CDFS: dict[str, tuple[str, Getter]] = {
    "ttft": ("TTFT (ms)", _ttft),
    "tpot": ("TPOT (ms)", _tpot),
    "e2e": ("E2E latency (ms)", _e2e),
    "itl": ("inter-token latency (ms)", _itl),
}


def _targets(results: list[RunResult]) -> list[str]:
    return list(dict.fromkeys(r.target for r in results))


def _legend(ax: plt.Axes, size: int = 8) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cdf_plot(results: list[RunResult], metric: str, path: Path) -> Path:
    """Empirical CDF per run: colour per target, line style per load."""
    xlabel, get = CDFS[metric]
    colours = {t: f"C{i % 10}" for i, t in enumerate(_targets(results))}
    loads = list(dict.fromkeys(r.load.label for r in results))
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        values = np.sort([v for rec in r.records if rec.success for v in get(rec)])
        if len(values):
            xs = np.concatenate([values[:1], values])
            ys = np.concatenate([[0.0], np.arange(1, len(values) + 1) / len(values)])
            style = styles[loads.index(r.load.label) % len(styles)]
            ax.step(xs, ys, style, where="post", color=colours[r.target], label=r.label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of requests" if metric != "itl" else "fraction of gaps")
    ax.set_title(f"{xlabel.split(' (')[0]} CDF")
    ax.grid(alpha=0.3)
    if len(results) <= 12:
        _legend(ax, 7)
    return _save(fig, path)


def _series(
    results: list[RunResult],
    target: str,
    x: Callable[[RunResult], float],
    y: Callable[[RunResult], float],
) -> tuple[list[float], list[float]]:
    pts = sorted((x(r), y(r)) for r in results if r.target == target)
    pts = [(a, b) for a, b in pts if math.isfinite(a) and math.isfinite(b)]
    return [a for a, _ in pts], [b for _, b in pts]


def _concurrency(r: RunResult) -> float:
    """Configured concurrency for closed-loop runs, else measured mean in flight."""
    return float(r.load.concurrency) if r.load.kind == "concurrency" else r.summary.mean_concurrency


def throughput_plot(results: list[RunResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t in _targets(results):
        xs, ys = _series(results, t, _concurrency, lambda r: r.summary.output_throughput)
        ax.plot(xs, ys, marker="o", label=t)
    ax.set_xlabel("concurrency (configured, or mean in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Throughput vs concurrency")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def ttft_load_plot(results: list[RunResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t in _targets(results):
        for stat, style in (("median", "-o"), ("p99", "--x")):
            xs, ys = _series(
                results, t, lambda r: r.summary.request_throughput,
                lambda r, s=stat: getattr(r.summary.ttft_ms, s),
            )  # fmt: skip
            ax.plot(xs, ys, style, label=f"{t} {stat}")
    ax.set_xlabel("achieved load (requests/s)")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT vs load")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (x, y), both higher-is-better, sorted by x."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def pareto_plot(results: list[RunResult], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t in _targets(results):
        pts = [
            (r.summary.total_throughput, r.summary.per_user_output_throughput)
            for r in results
            if r.target == t
        ]
        pts = [p for p in pts if all(math.isfinite(v) for v in p)]
        if not pts:
            continue
        (line,) = ax.plot(*zip(*pareto_front(pts), strict=True), "-", label=f"{t} frontier")
        ax.scatter(*zip(*pts, strict=True), color=line.get_color(), s=18)
    ax.set_xlabel("total tokens/s (all users)")
    ax.set_ylabel("output tokens/s per user (1 / TPOT)")
    ax.set_title("Pareto: per-user speed vs total throughput")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def write_plots(out_dir: Path, results: list[RunResult]) -> dict[str, Path]:
    """Every plot, in the web UI's colours and font (tokenmill/ui/theme.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with matplotlib.rc_context(matplotlib_style()):
        plots = {f"{m}_cdf": cdf_plot(results, m, out_dir / f"{m}_cdf.png") for m in CDFS}
        plots["throughput_vs_concurrency"] = throughput_plot(
            results, out_dir / "throughput_vs_concurrency.png"
        )
        plots["ttft_vs_load"] = ttft_load_plot(results, out_dir / "ttft_vs_load.png")
        plots["pareto"] = pareto_plot(results, out_dir / "pareto.png")
    return plots
