"""Flattens one scheduler step into model inputs and attention metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tokenmill.model.attention import AttentionMetadata, ChunkAttention
from tokenmill.scheduler.output import ScheduledRequest


@dataclass
class ModelInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    ordered: list[ScheduledRequest]  # decodes first, then chunks, in flat-batch order
    query_starts: list[int]  # row of each request's first token in the flat batch

    def to(self, device: torch.device) -> ModelInput:
        """The step's tensors on the compute device, copied once (asynchronously)."""
        if device.type == "cpu":
            return self

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        meta = self.attn_metadata
        meta.slot_mapping = move(meta.slot_mapping)
        meta.decode_block_table = move(meta.decode_block_table)
        meta.decode_seq_lens = move(meta.decode_seq_lens)
        for chunk in meta.chunks:
            chunk.block_ids = move(chunk.block_ids)  # masks are built beside them
        self.input_ids = move(self.input_ids)
        self.positions = move(self.positions)
        return self


def build_model_input(scheduled: list[ScheduledRequest], block_size: int) -> ModelInput:
    # Single-token queries, and requests verifying drafts: each drafted position is one more
    # single-token query row of its request (its own sequence length; K/V of all rows are
    # written before attention), so verification runs on the decode path.
    decodes = [sr for sr in scheduled if sr.num_new_tokens == 1 or sr.spec_token_ids]
    chunks = [sr for sr in scheduled if sr.num_new_tokens > 1 and not sr.spec_token_ids]
    ordered = decodes + chunks

    token_parts: list[np.ndarray] = []
    position_parts: list[np.ndarray] = []
    slot_parts: list[np.ndarray] = []
    query_starts: list[int] = []

    # Single-token queries: one gather over a padded block table.
    nd = sum(sr.num_new_tokens for sr in decodes)
    decode_table = decode_lens = None
    if nd:
        counts = np.fromiter((sr.num_new_tokens for sr in decodes), np.int64, len(decodes))
        firsts = np.fromiter(
            (sr.request.num_computed_tokens for sr in decodes), np.int64, len(decodes)
        )
        owner = np.repeat(np.arange(len(decodes)), counts)  # each row's request
        row_starts = np.cumsum(counts) - counts
        positions = firsts[owner] + np.arange(nd) - row_starts[owner]
        tokens = np.fromiter(
            (
                token
                for sr in decodes
                for token in (
                    sr.request.all_token_ids[sr.request.num_computed_tokens],
                    *sr.spec_token_ids,
                )
            ),
            dtype=np.int64,
            count=nd,
        )
        max_blocks = max(len(sr.block_ids) for sr in decodes)
        tables = np.zeros((len(decodes), max_blocks), dtype=np.int64)
        for row, sr in enumerate(decodes):
            tables[row, : len(sr.block_ids)] = sr.block_ids
        table = tables[owner]  # a request's table on each of its rows
        rows = np.arange(nd)
        slots = table[rows, positions // block_size] * block_size + positions % block_size
        token_parts.append(tokens)
        position_parts.append(positions)
        slot_parts.append(slots)
        query_starts.extend(row_starts.tolist())
        decode_table = torch.from_numpy(table)
        decode_lens = torch.from_numpy(positions + 1)

    chunk_meta: list[ChunkAttention] = []
    start = nd
    for sr in chunks:
        req = sr.request
        first, n = req.num_computed_tokens, sr.num_new_tokens
        positions = np.arange(first, first + n, dtype=np.int64)
        table = np.asarray(sr.block_ids, dtype=np.int64)
        token_parts.append(np.asarray(req.all_token_ids[first : first + n], dtype=np.int64))
        position_parts.append(positions)
        slot_parts.append(table[positions // block_size] * block_size + positions % block_size)
        context_len = first + n
        n_blocks = -(-context_len // block_size)
        chunk_meta.append(ChunkAttention(start, n, context_len, torch.from_numpy(table[:n_blocks])))
        query_starts.append(start)
        start += n

    meta = AttentionMetadata(
        slot_mapping=torch.from_numpy(np.concatenate(slot_parts)),
        num_decode_tokens=nd,
        decode_block_table=decode_table,
        decode_seq_lens=decode_lens,
        chunks=chunk_meta,
    )
    return ModelInput(
        input_ids=torch.from_numpy(np.concatenate(token_parts)),
        positions=torch.from_numpy(np.concatenate(position_parts)),
        attn_metadata=meta,
        ordered=ordered,
        query_starts=query_starts,
    )
