"""`serve --max-kld`: a server whose weights are over the budget refuses to start with a clear
message and exit status 2; under the budget /v1/models and /metrics show the measured KLD."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from tests.server.conftest import start_server


def test_serve_refuses_weights_over_the_kld_budget(tiny_llama_dir, fresh_cache):
    env = dict(os.environ)  # $TOKENMILL_CACHE: fresh_cache
    proc = subprocess.run(
        [sys.executable, "-m", "tokenmill.cli", "serve", "--model", str(tiny_llama_dir),
         "--weights", "q4_0", "--max-kld", "1e-9", "--port", "0", "--kv-cache-memory", "0.05"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: engine core failed to start: weights q4_0: mean KL divergence"
    ), last
    assert "exceeds --max-kld 1e-09" in last
    assert "Traceback" not in proc.stderr  # one clear line, not a stack (nor uvicorn's)


def test_served_weights_show_their_kld(tmp_path, tiny_llama_dir, fresh_cache):
    srv = start_server(
        tmp_path, "--model", str(tiny_llama_dir), "--weights", "q8_0", "--max-kld", "0.5"
    )
    try:
        models = httpx.get(f"{srv.v1}/models").json()["data"][0]
        assert models["weights"] == "q8_0"
        kld = models["weights_kld"]
        assert 0 < kld["mean_kld"] <= 0.5 and kld["num_tokens"] > 0
        one = httpx.get(f"{srv.v1}/models/{models['id']}").json()
        assert one["weights_kld"] == kld
        metrics = httpx.get(f"{srv.base_url}/metrics").text
        line = next(m for m in metrics.splitlines() if m.startswith("tokenmill:weights_kld{"))
        assert 'plan="q8_0"' in line
        assert abs(float(line.rsplit(" ", 1)[1]) - kld["mean_kld"]) < 1e-9
    finally:
        assert srv.stop() == 0
