"""The Triton attention backend: the KV write and one paged attention kernel for every step
(tokenmill/kernels/triton). The GPU's backend; on CPU tensors it runs only under Triton's
interpreter (TRITON_INTERPRET=1), which is how CI checks it inside the engine."""

from __future__ import annotations

import functools

import torch

from tokenmill.kernels.triton import triton_available
from tokenmill.model.attention import AttentionBackend, AttentionMetadata


def paged_metadata(meta: AttentionMetadata, block_size: int, device: torch.device):
    """The step's sequences as the kernel reads them: each decode or verification row its own
    one-row sequence, then each chunk. Built once per step (kept on `meta`)."""
    from tokenmill.kernels.triton.paged_attention import PagedAttentionMetadata

    if meta.paged is not None:
        return meta.paged
    nd = meta.num_decode_tokens
    q_lens = [1] * nd + [c.query_len for c in meta.chunks]
    seq_lens = [] if not nd else meta.decode_seq_lens.tolist()
    seq_lens += [c.context_len for c in meta.chunks]
    widths = [len(c.block_ids) for c in meta.chunks]
    if nd:
        widths.append(meta.decode_block_table.shape[1])
    table = torch.zeros(len(q_lens), max(widths, default=1), dtype=torch.int32)
    if nd:
        table[:nd, : meta.decode_block_table.shape[1]] = meta.decode_block_table
    for i, c in enumerate(meta.chunks):
        table[nd + i, : len(c.block_ids)] = c.block_ids
    starts = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    starts[1:] = torch.tensor(q_lens, dtype=torch.int32).cumsum(0)
    paged = PagedAttentionMetadata(
        query_start_loc=starts.to(device, non_blocking=True),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device, non_blocking=True),
        block_table=table.to(device, non_blocking=True),
        max_query_len=max(q_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
    )
    meta.paged = paged
    return paged


class TritonBackend(AttentionBackend):
    name = "triton"

    @classmethod
    def available(cls) -> bool:
        return triton_available()

    def forward(self, q, k, v, kv_cache, meta):
        from tokenmill.kernels.triton.kv_write import write_kv
        from tokenmill.kernels.triton.paged_attention import num_kv_splits, paged_attention

        nkv, hd = self.num_kv_heads, self.head_dim
        k_cache = kv_cache[0].view(-1, self.block_size, nkv, hd)
        v_cache = kv_cache[1].view(-1, self.block_size, nkv, hd)
        # the model runner puts the slot mapping on the compute device once per step
        write_kv(k.contiguous(), v.contiguous(), k_cache, v_cache, meta.slot_mapping)
        paged = paged_metadata(meta, self.block_size, q.device)
        splits = num_kv_splits(paged, nkv, _num_sms(q.device))
        sinks = None if self.sinks is None else self.sinks.float().contiguous()
        out = paged_attention(
            q.contiguous(), k_cache, v_cache, paged, self.scale, self.sliding_window, splits,
            sinks=sinks,
        )  # fmt: skip
        return out.view(q.shape[0], self.num_heads * hd)


@functools.cache  # asked by every layer of every step
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
