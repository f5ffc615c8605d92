"""What users mistype reaches them as one line and exit code 2 (no traceback), before a model
loads where it can, and a command that only reads creates nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.tiny_models import make_hf_model, save_hf_folder


def tokenmill(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "tokenmill.cli", *args]
    return subprocess.run(argv, capture_output=True, timeout=timeout)


def one_line_error(run: subprocess.CompletedProcess, says: str) -> None:
    err = run.stderr.decode(errors="replace")
    assert run.returncode == 2, err
    assert says in err and "Traceback" not in err, err


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_out_of_range_is_refused_before_the_model_loads(port):
    run = tokenmill("serve", "--port", port, timeout=30)
    one_line_error(run, "--port")


def test_a_prompt_that_is_not_utf8_is_refused():
    one_line_error(tokenmill("generate", "\udcff\udcfe bad"), "prompt: not valid UTF-8")


def test_a_model_folder_with_a_corrupt_weights_file(tmp_path):
    folder = save_hf_folder(make_hf_model("llama"), tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    run = tokenmill("generate", "hi", "--model", str(folder), "--no-warm-up")
    one_line_error(run, "model.safetensors: not a safetensors file")


def test_reading_keys_or_usage_needs_a_database_that_is_there(tmp_path):
    missing = tmp_path / "typo" / "gw.sqlite3"
    for command in (["keys", "list"], ["usage"]):
        one_line_error(tokenmill(*command, "--database", str(missing)), "no gateway database")
    assert not missing.parent.exists()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"\x00\x01not sqlite" * 400)
    for command in (["keys", "list"], ["gateway", "migrate"]):
        one_line_error(tokenmill(*command, "--database", str(garbage)), "not a database")


def test_a_key_cannot_be_made_already_expired(tmp_path):
    run = tokenmill("keys", "create", "--database", str(tmp_path / "gw.db"), "--expires-in=-5d")
    one_line_error(run, "expires-in: must be positive")
