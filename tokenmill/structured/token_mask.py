"""The next-token masks of grammar matchers as a tensor (engine side; the API process only
compiles grammars and never imports torch)."""

from __future__ import annotations

import llguidance
import torch

_BIT_SHIFTS = torch.arange(32, dtype=torch.int32)


def allowed_mask(matchers: list[llguidance.LLMatcher], vocab_size: int) -> torch.Tensor:
    """[len(matchers), vocab_size] bool: the tokens each matcher accepts next."""
    words = (vocab_size + 31) // 32
    bitmask = torch.empty(len(matchers), words, dtype=torch.int32)
    for row, m in enumerate(matchers):
        m.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), words * 4)
    bits = (bitmask.unsqueeze(-1) >> _BIT_SHIFTS) & 1
    return bits.view(len(matchers), words * 32)[:, :vocab_size].bool()
