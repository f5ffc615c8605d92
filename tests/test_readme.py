"""The README's commands work as written: its first two commands are the ones a fresh machine
and CI run, and its quick start (the curl command and the openai-client snippet) succeeds
against a real `tokenmill serve` started by the CLI. scripts/test.sh is not run from here
(it runs this file) and nothing is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import start_server

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", README, flags=re.S | re.M)
DEFAULT_V1 = "http://127.0.0.1:8000/v1"


def blocks(language: str, containing: str = "") -> list[str]:
    return [code for lang, code in BLOCKS if lang == language and containing in code]


def commands(code: str) -> list[str]:
    """A shell block's commands: no comments, no blank lines."""
    return [line for line in code.splitlines() if line.strip() and not line.startswith("#")]


def test_the_first_commands_are_setup_and_serve_then_the_tests():
    first_language, first = BLOCKS[0]
    assert first_language == "bash"
    assert commands(first) == ["scripts/setup.sh && .venv/bin/tokenmill serve", "scripts/test.sh"]
    for script in ("scripts/setup.sh", "scripts/test.sh", ".ci/run"):
        assert (REPO / script).stat().st_mode & 0o111, f"{script} is not executable"
    ci = [line for line in commands((REPO / ".ci" / "run").read_text()) if "scripts/" in line]
    assert ci == ["exec scripts/test.sh"], ci


def test_the_readme_is_short_and_its_links_resolve():
    assert len(README.splitlines()) <= 300
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [link for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]
    assert local, "the README links into docs/"
    missing = [link for link in local if not (REPO / link.split("#")[0]).exists()]
    assert not missing, missing


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # the real CLI (python -m tokenmill.cli serve), as `.venv/bin/tokenmill serve` runs it; a
    # chat request without max_tokens gets at most 256 tokens here, to keep the test short
    srv = start_server(tmp_path_factory.mktemp("readme"), "--default-max-tokens", "256")
    yield srv
    assert srv.stop() == 0, srv.log()[-3000:]


def test_the_quick_start_curl_command(server):
    (code,) = blocks("bash", "curl ")
    assert "localhost:8000" in code
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    port = server.base_url.rsplit(":", 1)[1]
    run = subprocess.run(
        ["bash", "-c", code.replace("localhost:8000", f"127.0.0.1:{port}")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    reply = json.loads(run.stdout)
    assert reply["object"] == "chat.completion", reply
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0


def test_the_quick_start_openai_client_snippet(server):
    (code,) = blocks("python", "from openai import OpenAI")
    assert DEFAULT_V1 in code
    run = subprocess.run(
        [sys.executable, "-c", code.replace(DEFAULT_V1, server.v1)],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    text, _, usage = run.stdout.rpartition("\n")
    assert text.strip(), run.stdout  # the streamed reply
    assert usage.startswith("CompletionUsage(") and "completion_tokens=" in usage, run.stdout


def test_the_offline_python_snippet():
    (code,) = blocks("python", "from tokenmill import LLM")
    run = subprocess.run(
        [sys.executable, "-c", code.replace("LLM()", "LLM(kv_cache_memory_gib=0.25)")],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()
