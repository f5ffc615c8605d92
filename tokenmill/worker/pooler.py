"""Pooling requests in the model runner: a prompt's hidden states, chunk by chunk, become one
vector (last token, mean or first token; L2-normalised; cut to `dimensions`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tokenmill.request import Request


def final_hidden(model, hidden: torch.Tensor) -> torch.Tensor:
    """The model's output states (after its final norm), float32: what pooling reads."""
    own = getattr(model, "final_hidden", None)
    if own is not None:
        return own(hidden)
    cfg = model.config
    return F.rms_norm(hidden.float(), (hidden.shape[-1],), model.norm, cfg.rms_norm_eps)


def pool_chunk(model, req: Request, hidden: torch.Tensor, last: bool) -> list[float] | None:
    """Takes one scheduled chunk of a pooling request's prompt ([n, hidden], starting at
    req.num_computed_tokens); the pooled vector once `last` (the prompt is complete).
    Parts are kept by their start position, so re-running a step (fault isolation) or
    recomputing after preemption replaces them instead of adding twice."""
    params = req.pooling_params
    assert params is not None
    start = req.num_computed_tokens
    if start == 0:
        req.pooled_parts.clear()
    kind = params.pooling_type
    if kind == "MEAN":
        req.pooled_parts[start] = final_hidden(model, hidden).sum(dim=0)
    elif kind == "CLS" and start == 0:
        req.pooled_parts[0] = final_hidden(model, hidden[:1])[0]
    if not last:
        return None
    if kind == "LAST":
        vector = final_hidden(model, hidden[-1:])[0]
    elif kind == "MEAN":
        vector = torch.stack(list(req.pooled_parts.values())).sum(dim=0) / req.num_prompt_tokens
    else:
        vector = req.pooled_parts[0]
    req.pooled_parts.clear()
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    if params.normalize:
        vector = F.normalize(vector, dim=0)
    return vector.tolist()
