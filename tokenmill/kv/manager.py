"""KV cache manager: which blocks each request holds, allocation for a step, freeing."""

from __future__ import annotations

from tokenmill.kv.block_pool import BlockPool, KVCacheBlock
from tokenmill.scheduler.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more tokens of `request`; False if the pool is short."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(blocks)
        if needed <= 0:
            return True
        if needed > self.pool.num_free_blocks:
            return False
        blocks.extend(self.pool.allocate(needed))
        return True

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        # Tail first: when cached blocks are evicted later, a prefix's end goes before its start.
        self.pool.free(list(reversed(blocks)))

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        held = sum(len(b) for b in self.req_to_blocks.values())
        referenced = sum(b.ref_cnt for b in self.pool.blocks)
        assert held == referenced, f"requests hold {held} block refs, pool counts {referenced}"
