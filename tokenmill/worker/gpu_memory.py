"""KV blocks on a GPU: sized from what is left of --gpu-memory-utilization after the weights
and the peak of a warm-up forward at the step's largest size (vLLM's memory profiling)."""

from __future__ import annotations

import logging

import torch

from tokenmill.config import EngineConfig
from tokenmill.model.attention import AttentionBackend, AttentionMetadata, ChunkAttention
from tokenmill.worker.model_runner import kv_bytes_per_block

logger = logging.getLogger(__name__)


def _profile_forward(model, attn: AttentionBackend, device, dtype, tokens: int, rows: int) -> int:
    """Runs one prefill of `tokens` tokens and the logits of `rows` of them; the bytes its
    KV blocks took."""
    blocks = -(-tokens // attn.block_size)
    caches = [
        attn.allocate_kv_cache(blocks, dtype, device) for _ in range(model.config.num_hidden_layers)
    ]
    ids = torch.zeros(tokens, dtype=torch.long, device=device)
    positions = torch.arange(tokens, device=device)
    chunk = ChunkAttention(0, tokens, tokens, torch.arange(blocks, device=device))
    meta = AttentionMetadata(positions.clone(), 0, None, None, [chunk])
    hidden = model.forward(ids, positions, caches, attn, meta)
    logits = model.compute_logits(hidden[-rows:]).float()
    logits.log_softmax(dim=1).sort(dim=1)  # the sampler's largest temporaries
    torch.cuda.synchronize(device)
    return sum(c.numel() * c.element_size() for c in caches)


def profile_num_blocks(
    model, backend: type[AttentionBackend], config: EngineConfig, kv_dtype: torch.dtype
) -> int:
    cfg, cache, sched = model.config, config.cache_config, config.scheduler_config
    device = model.method.device
    attn = backend(
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cache.block_size,
        cfg.sliding_window,
    )  # fmt: skip
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    free, total = torch.cuda.mem_get_info(device)
    weights = torch.cuda.memory_allocated(device)
    non_torch = (total - free) - torch.cuda.memory_reserved(device)  # CUDA context, NCCL
    tokens = min(sched.max_num_batched_tokens, cfg.max_position_embeddings)
    with torch.inference_mode():
        profile_kv = _profile_forward(
            model, attn, device, kv_dtype, tokens, min(sched.max_num_seqs, tokens)
        )
    activations = torch.cuda.max_memory_allocated(device) - weights - profile_kv
    torch.cuda.empty_cache()
    budget = total * cache.gpu_memory_utilization - non_torch - weights - activations
    per_block = kv_bytes_per_block(model, cache.block_size, kv_dtype)
    num_blocks = int(budget // per_block)
    logger.info(
        "GPU memory: %.1f GiB total, weights %.1f GiB, activations %.1f GiB, other %.1f GiB: "
        "%d KV blocks (%.1f GiB) at utilization %.2f",
        total / 2**30, weights / 2**30, activations / 2**30, non_torch / 2**30, num_blocks,
        num_blocks * per_block / 2**30, cache.gpu_memory_utilization,
    )  # fmt: skip
    if num_blocks < 1:
        raise ValueError(
            "gpu_memory_utilization: no memory left for the KV cache after the weights and "
            f"activations ({(weights + activations) / 2**30:.1f} GiB); raise it or lower "
            "max_num_batched_tokens"
        )
    return num_blocks
