"""The pool of device KV blocks: reference counts, an LRU queue of free blocks, and the map of
cached (full, hashed) blocks that prefix caching reuses."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tokenmill.kv.hashing import BlockHash


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set once the block is full and cached


# Called with a cached block just before its content is overwritten (offload, events).
EvictionHook = Callable[[KVCacheBlock], None]


class BlockPool:
    """Every block is either referenced (ref_cnt > 0) or in the free queue. Free blocks that
    still hold a cached prefix keep their hash until they are taken for new content.

    The free queue is least-recently-freed first, so eviction takes the oldest; requests free
    their blocks tail-first, so a prefix's last blocks go before its first ones.
    """

    def __init__(self, num_blocks: int, on_evict: EvictionHook | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks
        )
        self.cached: dict[BlockHash, KVCacheBlock] = {}
        self.on_evict = on_evict

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for b in self.free_queue.values() if b.block_hash is not None)

    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def allocate(self, count: int) -> list[KVCacheBlock]:
        if count > len(self.free_queue):
            raise RuntimeError(f"cannot allocate {count} blocks, {len(self.free_queue)} free")
        out = []
        for _ in range(count):
            _, block = self.free_queue.popitem(last=False)
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        if self.on_evict is not None:
            self.on_evict(block)
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
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

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash) -> bool:
        """Registers a full block under its hash; False if another block already holds it."""
        if block.block_hash is not None:
            return False
        if block_hash in self.cached:
            return False
        block.block_hash = block_hash
        self.cached[block_hash] = block
        return True

    def lookup(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached.get(block_hash)

    def reset_cache(self) -> bool:
        """Forgets every cached prefix; only when no block is in use (as vLLM)."""
        if self.num_used_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True

    def check_invariants(self) -> None:
        free = sum(1 for b in self.blocks if b.ref_cnt == 0)
        assert free == len(self.free_queue), (
            f"{free} blocks unreferenced, {len(self.free_queue)} in free queue"
        )
        assert all(b.ref_cnt == 0 for b in self.free_queue.values()), (
            "referenced block in free queue"
        )
        assert self.num_free_blocks + self.num_used_blocks == self.num_blocks
        for h, block in self.cached.items():
            assert block.block_hash == h, "cached map out of sync with block hashes"
        assert len(self.cached) == sum(1 for b in self.blocks if b.block_hash is not None)
