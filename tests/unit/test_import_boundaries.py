"""Processes that only serve HTTP (the API process, the router) do not import the engine
core: it is spawned by name (engine/core_entry.py) and validators live in tokenmill/inputs."""

from __future__ import annotations

import subprocess
import sys


def test_api_and_router_do_not_import_the_engine_core():
    script = (
        "import sys\n"
        "import tokenmill.server.api, tokenmill.server.cli, tokenmill.router.app\n"
        "import tokenmill.engine.async_llm\n"
        "bad = [m for m in ('tokenmill.engine.core', 'tokenmill.engine.core_proc',\n"
        "       'tokenmill.scheduler.scheduler', 'tokenmill.worker.model_runner') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
