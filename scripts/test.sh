#!/usr/bin/env bash
# Sets up the environment and runs the default test suite (slow tests excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check tokenmill tests benchmarks
exec .venv/bin/python -m pytest -m "not slow" -q "$@"
