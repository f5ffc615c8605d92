"""The Triton kernels run on a CUDA device when there is one, otherwise on CPU tensors under
Triton's interpreter (set before any kernel module is imported; fp32/fp16 only)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime import interpreter

    _patch_lang_tensor = interpreter._patch_lang_tensor

    def _patch_with_scalar_index(tensor, scope) -> None:
        """Triton 3.6's interpreter turns scalars (1-element arrays) into loop bounds with
        int(array), which NumPy >= 2.4 refuses for arrays of one dimension: use .item()."""
        _patch_lang_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = _patch_with_scalar_index

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# bf16 only on a device: the interpreter computes in numpy, which has no bfloat16
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])
