"""GuideLLM (`guidellm run`, its CLI as users start it) against a live server: synthetic prompts
of an exact token count made with the model's exported tokenizer (`tokenmill tokenizer
export`: no model hub), streamed chat and text completions, concurrent streams."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.compat.common import SKIP_REASON
from tokenmill.model.model_files import read_model_info
from tokenmill.model.tokenizer_export import export_tokenizer

pytest.importorskip("guidellm", reason=SKIP_REASON)

PROMPT_TOKENS, OUTPUT_TOKENS, REQUESTS = 48, 24, 4


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    export_tokenizer(read_model_info(None), path)
    return path


def guidellm_run(server, tokenizer: Path, out: Path, request_format: str) -> dict:
    cli = shutil.which("guidellm", path=os.path.dirname(sys.executable))
    assert cli, "the guidellm command is not installed next to this interpreter"
    backend = f"kind=openai_http,target={server.base_url},request_format={request_format}"
    data = f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}"
    cmd = [
        cli, "run",
        "--backend", backend,
        "--profile", "kind=concurrent,streams=2",
        "--constraint", f"kind=max_requests,count={REQUESTS}",
        "--data", data,
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--output", f"kind=json,path={out}",
        "--disable-console",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    (benchmark,) = report["benchmarks"]
    return benchmark["metrics"]


def counts(metrics: dict, name: str) -> tuple[float, float]:
    stats = metrics[name]["successful"]
    return stats["min"], stats["max"]


@pytest.mark.parametrize("request_format", ["/v1/chat/completions", "/v1/completions"])
def test_guidellm_benchmark_completes_with_exact_token_counts(
    compat_server, tokenizer_dir, tmp_path, request_format
):
    metrics = guidellm_run(compat_server, tokenizer_dir, tmp_path / "report.json", request_format)
    assert metrics["request_totals"] == {
        "successful": REQUESTS,
        "errored": 0,
        "incomplete": 0,
        "total": REQUESTS,
    }
    # GuideLLM asks for exactly OUTPUT_TOKENS (max_tokens + ignore_eos) and reads usage
    assert counts(metrics, "output_token_count") == (OUTPUT_TOKENS, OUTPUT_TOKENS)
    low, high = counts(metrics, "prompt_token_count")
    assert low == high
    if request_format == "/v1/completions":
        # prompts built with the exported tokenizer are as long on the server
        assert low == PROMPT_TOKENS
    else:  # plus the chat template's system prompt and role markers
        assert PROMPT_TOKENS < low < PROMPT_TOKENS + 40
    assert metrics["time_to_first_token_ms"]["successful"]["mean"] > 0
    assert metrics["output_tokens_per_second"]["successful"]["mean"] > 0
