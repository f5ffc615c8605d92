"""The look the web UI and the bench report share, from one file: static/css/theme.css.
The report embeds that CSS; its matplotlib plots take their colours (series in order, text,
axes, grid) from the same variables."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

THEME_CSS = Path(__file__).parent / "static" / "css" / "theme.css"
_VARIABLE = re.compile(r"--([a-z0-9-]+):\s*([^;]+);")


def theme_css() -> str:
    return THEME_CSS.read_text()


@cache
def variables() -> dict[str, str]:
    """theme.css's custom properties, e.g. {"fg": "#1f2328", "series-1": "#0969da"}."""
    return {name: value.strip() for name, value in _VARIABLE.findall(theme_css())}


def series_colours() -> list[str]:
    found = variables()
    return [found[f"series-{i}"] for i in range(1, 100) if f"series-{i}" in found]


def matplotlib_style() -> dict[str, object]:
    """rcParams for matplotlib.rc_context: the theme's colours and a sans-serif font."""
    from cycler import cycler

    v = variables()
    return {
        "axes.prop_cycle": cycler(color=series_colours()),
        "text.color": v["fg"],
        "axes.labelcolor": v["fg"],
        "axes.edgecolor": v["border"],
        "xtick.color": v["muted"],
        "ytick.color": v["muted"],
        "grid.color": v["grid"],
        "axes.grid": True,
        "font.family": "sans-serif",
        "legend.frameon": False,
    }
