#!/usr/bin/env bash
# Retakes the pictures of the web UI in docs/ui.md (docs/img/ui-*.png) with the browser tests
# (tests/ui); the tests save every screenshot under test-artifacts/ui/ anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
TOKENMILL_UI_SCREENSHOTS=docs/img exec "$PYTHON" -m pytest -q -p no:cacheprovider \
    tests/ui/test_dashboard.py tests/ui/test_playground.py tests/ui/test_router_gateway.py "$@"
