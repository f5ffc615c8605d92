"""One live `tokenmill serve` shared by the third-party client compatibility tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.server.conftest import ServerProcess, start_server

# Set before any client library is imported (several read these at import time): nothing may
# reach a model/dataset hub, a price list or a tracing backend; the machines have no internet.
os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "LANGCHAIN_TRACING_V2": "false",
        "LANGSMITH_TRACING": "false",
    }
)


@pytest.fixture(scope="package")
def compat_server(tmp_path_factory) -> Iterator[ServerProcess]:
    """The default server (prefix caching on), as a user would start it; stopped when the
    compat package's tests are done so it does not sit through the rest of the run."""
    srv = start_server(tmp_path_factory.mktemp("compat-server"), "--max-num-seqs", "32")
    yield srv
    code = srv.stop()
    assert code == 0, f"server exit code {code} after SIGTERM:\n{srv.log()[-3000:]}"
