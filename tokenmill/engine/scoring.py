"""Full-sequence logits through the paged engine path, for parity checks and fidelity metrics
(KL divergence of a quantized model against full precision)."""

from __future__ import annotations

import torch

from tokenmill.engine.core import EngineCore
from tokenmill.request import Request
from tokenmill.sampling_params import SamplingParams
from tokenmill.scheduler.scheduler import ScheduledRequest
from tokenmill.worker.input_batch import build_model_input


@torch.inference_mode()
def sequence_logits(
    core: EngineCore, token_ids: list[int], chunk_size: int | None = None
) -> torch.Tensor:
    """Logits [len(token_ids), vocab] at every position, computed in chunks over the KV cache.

    Runs outside the scheduler, so call it on an idle engine.
    """
    if core.has_unfinished_requests():
        raise RuntimeError("sequence_logits needs an idle engine")
    req = Request("__score__", token_ids, SamplingParams(max_tokens=1), [], core.max_model_len + 1)
    chunk = chunk_size or core.config.scheduler_config.max_num_batched_tokens
    runner, kv = core.runner, core.kv_manager
    parts = []
    try:
        while req.num_computed_tokens < len(token_ids):
            n = min(chunk, len(token_ids) - req.num_computed_tokens)
            if not kv.allocate_slots(req, n):
                raise RuntimeError("the KV cache is too small for this sequence")
            sr = ScheduledRequest(req, n, kv.get_block_ids(req.request_id))
            inp = build_model_input([sr], kv.block_size, core.model.config.sliding_window)
            hidden = core.model.forward(
                inp.input_ids, inp.positions, runner.kv_caches, runner.attn, inp.attn_metadata
            )
            parts.append(core.model.compute_logits(hidden).float())
            req.num_computed_tokens += n
    finally:
        kv.free(req)
    return torch.cat(parts)
