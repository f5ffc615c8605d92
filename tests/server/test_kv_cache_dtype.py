"""`tokenmill serve --kv-cache-dtype float16`: the served engine keeps K/V in float16 (twice
the blocks of the same --kv-cache-memory) and answers as the float32 pool's server does;
a value it does not know ends the start with status 2."""

from __future__ import annotations

import subprocess
import sys

import httpx

from tests.server.conftest import MODEL, start_server


def test_serve_with_a_float16_kv_cache(tmp_path, server):
    srv = start_server(tmp_path, "--kv-cache-dtype", "float16")
    try:
        info = httpx.get(f"{srv.base_url}/server_info", timeout=10).json()["engine"]
        assert info["device"]["kv_dtype"] == "float16", info
        full_info = httpx.get(f"{server.base_url}/server_info", timeout=10).json()["engine"]
        assert full_info["device"]["kv_dtype"] == "float32"
        assert info["num_blocks"] == 2 * full_info["num_blocks"]  # the same --kv-cache-memory
        body = {
            "model": MODEL, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0, "logprobs": 1,
        }  # fmt: skip
        half = httpx.post(f"{srv.v1}/completions", json=body, timeout=60).json()
        full = httpx.post(f"{server.v1}/completions", json=body, timeout=60).json()
        assert half["usage"]["completion_tokens"] == 8
        # the first token's log-probability over the float16 pool: within its rounding
        lp = [c["logprobs"]["token_logprobs"][0] for c in (half["choices"][0], full["choices"][0])]
        assert abs(lp[0] - lp[1]) < 0.05, lp
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


def test_an_unknown_kv_cache_dtype_ends_the_start_with_status_2():
    done = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "serve", "--kv-cache-dtype", "fp4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--kv-cache-dtype" in done.stderr and "Traceback" not in done.stderr
