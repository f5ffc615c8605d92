"""The packaged texts: one to calibrate on, another to measure fidelity on (kept apart so a
calibration is never judged on the text it was fitted to). Both are English documentation
prose with code (Python standard-library docstrings), shipped as files: nothing downloads."""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).parent / "data"
CALIBRATION_TEXT = _DATA / "calibration.txt"
EVALUATION_TEXT = _DATA / "evaluation.txt"
# Bound on a user's text file (it is tokenized whole)
MAX_TEXT_BYTES = 64 << 20


def read_text(source: str | Path | None, default: Path) -> str:
    """`source` None or "builtin": the packaged default; else a UTF-8 text file."""
    path = default if source in (None, "builtin") else Path(source)
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise ValueError(f"{path}: {size} bytes, over the {MAX_TEXT_BYTES >> 20} MiB bound")
    return path.read_text(encoding="utf-8", errors="replace")
