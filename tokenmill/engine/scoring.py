"""Full-sequence logits through the paged engine path, for parity checks and fidelity metrics
(KL divergence of a quantized model against full precision)."""

from __future__ import annotations

import torch

from tokenmill.engine.core import EngineCore
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.output import ScheduledRequest
from tokenmill.worker.input_batch import build_model_input


@torch.inference_mode()
def sequence_logits(
    core: EngineCore, token_ids: list[int], chunk_size: int | None = None
) -> torch.Tensor:
    """Logits [len(token_ids), vocab] at every position, computed in chunks over the KV cache.

    Runs outside the scheduler, so call it on an idle engine.
    """
    return torch.cat(
        [core.model.compute_logits(h).float() for h in _hidden_chunks(core, token_ids, chunk_size)]
    )


@torch.inference_mode()
def sequence_hidden(
    core: EngineCore, token_ids: list[int], chunk_size: int | None = None
) -> torch.Tensor:
    """The last decoder layer's output [len(token_ids), hidden] (before the final norm) at
    every position: the features a draft head learns from. Call it on an idle engine."""
    return torch.cat([h.float() for h in _hidden_chunks(core, token_ids, chunk_size)])


def _hidden_chunks(core: EngineCore, token_ids: list[int], chunk_size: int | None):
    if core.has_unfinished_requests():
        raise RuntimeError("scoring needs an idle engine")
    req = Request("__score__", token_ids, SamplingParams(max_tokens=1), [], core.max_model_len + 1)
    chunk = chunk_size or core.config.scheduler_config.max_num_batched_tokens
    runner, kv = core.runner, core.kv_manager
    try:
        while req.num_computed_tokens < len(token_ids):
            n = min(chunk, len(token_ids) - req.num_computed_tokens)
            if not kv.allocate_slots(req, n):
                raise RuntimeError("the KV cache is too small for this sequence")
            sr = ScheduledRequest(req, n, kv.get_block_ids(req.request_id))
            inp = build_model_input([sr], kv.block_size)
            yield core.model.forward(
                inp.input_ids, inp.positions, runner.kv_caches, runner.attn, inp.attn_metadata
            )
            req.num_computed_tokens += n
    finally:
        kv.free(req)
