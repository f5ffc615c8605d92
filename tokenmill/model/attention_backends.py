"""The attention backends by name (--attention-backend) and the choice `auto` makes."""

from __future__ import annotations

import torch

from tokenmill.config import ATTENTION_BACKENDS as BACKEND_NAMES  # --attention-backend
from tokenmill.model.attention import AttentionBackend, CPUPagedBackend, TorchSDPABackend
from tokenmill.model.attention_triton import TritonBackend

ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {
    CPUPagedBackend.name: CPUPagedBackend,
    TorchSDPABackend.name: TorchSDPABackend,
    TritonBackend.name: TritonBackend,
}


def get_attention_backend(name: str | None = None, device: str = "cpu") -> type[AttentionBackend]:
    """The named backend, or for "auto"/None the device's first available one: CUDA runs
    Triton (torch SDPA without Triton), the CPU its native kernel (torch without a compiler)."""
    if name in (None, "auto"):
        order = ("triton", "torch") if torch.device(device).type == "cuda" else ("native", "torch")
        return next(ATTENTION_BACKENDS[n] for n in order if ATTENTION_BACKENDS[n].available())
    if name not in ATTENTION_BACKENDS:
        raise ValueError(
            f"attention_backend: unknown value {name!r} (one of {', '.join(BACKEND_NAMES)})"
        )
    backend = ATTENTION_BACKENDS[name]
    if not backend.available():
        raise ValueError(f"attention_backend: {name!r} is not available on this machine")
    if name == "native" and torch.device(device).type != "cpu":
        raise ValueError("attention_backend: 'native' runs on the CPU only")
    return backend
