#!/usr/bin/env bash
# Sets up the environment and runs the default test suite (slow tests excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# tests/ui drive Debian's Chromium headless: install it when missing (CI runs as root)
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
    echo "installing chromium for the web UI's browser tests (tests/ui)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium >/dev/null
fi
# where this script could install it, a missing browser fails tests/ui instead of skipping it
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    export TOKENMILL_UI_BROWSER=required
fi
.venv/bin/ruff check tokenmill tests benchmarks
exec .venv/bin/python -m pytest -m "not slow" -q "$@"
