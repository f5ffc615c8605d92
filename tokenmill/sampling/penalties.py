"""Repetition, frequency and presence penalties (OpenAI / vLLM semantics)."""

from __future__ import annotations

import torch


def token_counts(
    token_lists: list[list[int]], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """[rows, vocab] counts of each token id per row (built with one copy to `device`)."""
    rows = [row for row, tokens in enumerate(token_lists) for _ in tokens]
    ids = [token for tokens in token_lists for token in tokens]
    flat = torch.tensor(rows, dtype=torch.long) * vocab_size + torch.tensor(ids, dtype=torch.long)
    counts = torch.zeros(len(token_lists) * vocab_size, dtype=torch.float32, device=device)
    counts.index_add_(0, flat.to(device), torch.ones(len(ids), device=device))
    return counts.view(len(token_lists), vocab_size)


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: list[list[int]],
    output_token_ids: list[list[int]],
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    vocab = logits.shape[1]
    output_counts = token_counts(output_token_ids, vocab, logits.device)
    if (repetition_penalty != 1.0).any():
        seen = token_counts(prompt_token_ids, vocab, logits.device).gt(0) | output_counts.gt(0)
        rep = repetition_penalty.unsqueeze(1).expand_as(logits)
        penalized = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, penalized, logits)
    logits = logits - frequency_penalty.unsqueeze(1) * output_counts
    logits = logits - presence_penalty.unsqueeze(1) * (output_counts > 0).float()
    return logits
