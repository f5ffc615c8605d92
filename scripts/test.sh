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
# the documentation site (mkdocs.yml, docs/): a broken link or anchor fails here. Built into a
# temporary folder, never committed (not with --quiet: it hides the warnings --strict counts)
site_dir=$(mktemp -d)
if ! NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site_dir/site" \
        >"$site_dir/build.log" 2>&1; then
    grep -v '^INFO' "$site_dir/build.log" >&2
    rm -rf "$site_dir"
    echo "the documentation site does not build: mkdocs build --strict failed" >&2
    exit 1
fi
rm -rf "$site_dir"
# the package's structure: allowed imports per layer, no circles, no function over 100 lines
.venv/bin/python scripts/check_layers.py
exec .venv/bin/python -m pytest -m "not slow" -q "$@"
