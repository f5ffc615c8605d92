"""Triton kernels of the GPU path. They also run on CPU tensors under TRITON_INTERPRET=1
(fp32/fp16), which is how CI tests them against the torch reference."""

from __future__ import annotations

import os


def triton_available() -> bool:
    """Triton is importable and can run here: a CUDA device, or the interpreter."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    import torch

    return torch.cuda.is_available()
