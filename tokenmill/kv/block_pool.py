"""The pool of KV cache blocks: reference counts and an LRU queue of free blocks."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None  # set once the block is full and cached


class BlockPool:
    """Owns every block. A block is either referenced (ref_cnt > 0) or in the free queue.

    The free queue is ordered least-recently-freed first, so eviction takes the oldest.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks
        )

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def allocate(self, count: int) -> list[KVCacheBlock]:
        if count > len(self.free_queue):
            raise RuntimeError(f"cannot allocate {count} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(count):
            _, block = self.free_queue.popitem(last=False)
            self.evict_hook(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def evict_hook(self, block: KVCacheBlock) -> None:
        """Called when a free block is taken for new content (prefix caching drops its hash)."""
        block.block_hash = None

    def touch(self, block: KVCacheBlock) -> None:
        """Take one more reference; a free (cached) block leaves the free queue."""
        if block.ref_cnt == 0:
            del self.free_queue[block.block_id]
        block.ref_cnt += 1

    def free(self, blocks: list[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order (callers pass tail-first)."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def check_invariants(self) -> None:
        free = sum(1 for b in self.blocks if b.ref_cnt == 0)
        assert free == len(self.free_queue), (
            f"{free} blocks unreferenced, {len(self.free_queue)} in free queue"
        )
        assert all(b.ref_cnt == 0 for b in self.free_queue.values()), (
            "referenced block in free queue"
        )
        assert self.num_free_blocks + self.num_used_blocks == self.num_blocks
