"""Finding Debian's Chromium (Playwright's own browser download is never used) and the
place the browser tests leave their screenshots."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
# TOKENMILL_UI_SCREENSHOTS=docs/img (scripts/ui_screenshots.sh): the pictures of docs/ui.md
DOCS_ENV = "TOKENMILL_UI_SCREENSHOTS"
SAVED: list[Path] = []  # this session's screenshots (for the summary line)
_NAMES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")


def chromium_path() -> str | None:
    """$TOKENMILL_CHROMIUM, else the first Chromium on PATH."""
    explicit = os.environ.get("TOKENMILL_CHROMIUM")
    if explicit:
        return explicit
    return next((p for p in map(shutil.which, _NAMES) if p), None)


def screenshot(page, name: str) -> Path:
    """Saves a screenshot under test-artifacts/ui (and the docs folder when asked)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    SAVED.append(path)
    docs = os.environ.get(DOCS_ENV)
    if docs and name.startswith("ui-"):  # the pictures docs/ui.md shows
        target = REPO / docs / f"{name}.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return path
