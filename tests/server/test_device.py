"""`serve --device`: the device the model runs on, as /v1/models and /server_info report it
from a real server; FP8 weights behind the KLD gate; a GPU asked for where there is none is a
clear error at start."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import torch

from tests.server.conftest import start_server


def test_served_device_and_fp8_weights_under_the_kld_gate(tmp_path, tiny_llama_dir, fresh_cache):
    srv = start_server(
        tmp_path, "--model", str(tiny_llama_dir), "--device", "auto", "--weights", "fp8",
        "--max-kld", "0.5",
    )  # fmt: skip
    try:
        model = httpx.get(f"{srv.v1}/models").json()["data"][0]
        expected = "cuda" if torch.cuda.is_available() else "cpu"
        assert model["device"] == expected and model["weights"] == "fp8"
        assert 0 < model["weights_kld"]["mean_kld"] <= 0.5
        engine = httpx.get(f"{srv.base_url}/server_info").json()["engine"]
        assert engine["device"]["type"] == expected
        assert engine["device"]["attention_backend"] == (
            "triton" if expected == "cuda" else "native"
        )
        reply = httpx.post(
            f"{srv.v1}/completions",
            json={"model": model["id"], "prompt": "Hello", "max_tokens": 4, "ignore_eos": True},
            timeout=60,
        )
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
    finally:
        assert srv.stop() == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_serve_on_cuda_without_a_gpu_exits_with_a_clear_error(tiny_llama_dir, fresh_cache):
    proc = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "serve", "--model", str(tiny_llama_dir),
         "--device", "cuda", "--port", "0", "--kv-cache-memory", "0.05"],
        capture_output=True, text=True, timeout=300,
        env=dict(os.environ),  # $TOKENMILL_CACHE: fresh_cache
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "error: engine core failed to start: device: 'cuda' asked for, but torch sees no "
        "CUDA device here"
    ), last
