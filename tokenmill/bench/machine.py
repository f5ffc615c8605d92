"""Facts about the machine and the code a report was made with."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from tokenmill.platform import cpu_model


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo's `flags`: avx2, avx512_vnni, amx_int8, ...);
    empty where the file is not there."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_meta() -> dict[str, Any]:
    try:
        from importlib.metadata import version

        tm_version = version("tokenmill")
    except Exception:  # noqa: BLE001 (metadata is optional)
        tm_version = None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "tokenmill": tm_version,
        "commit": git_commit(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
