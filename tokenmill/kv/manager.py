"""KV cache manager: block tables per request, prefix-cache hits across tiers, allocation
for a step, caching of full blocks, freeing."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from tokenmill.kv.block_pool import BlockPool, KVCacheBlock
from tokenmill.kv.hashing import BlockHash, block_hashes
from tokenmill.kv.offload import MEDIUM_DEVICE, TieredStore
from tokenmill.request import Request

logger = logging.getLogger(__name__)

MEDIUM_REMOTE = "remote"  # blocks pulled from a prefill worker (kv/connector)
# stands in a request's block table for a block freed out of the sliding window (never in
# the pool: nothing counts or frees it)
NULL_BLOCK = KVCacheBlock(block_id=0)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockIO(Protocol):
    """Moves one block's K/V (all layers) between the device pool and a host tensor."""

    def read_block(self, block_id: int) -> torch.Tensor: ...
    def write_block(self, block_id: int, data: torch.Tensor) -> None: ...
    def write_blocks(self, writes: list[tuple[int, Any]]) -> None: ...


class KVEventSink(Protocol):
    def block_stored(
        self,
        medium: str,
        hashes: list[BlockHash],
        parent: BlockHash | None,
        token_ids: list[int],
        lora_id: int | None = None,
    ) -> None: ...
    def block_removed(self, medium: str, hashes: list[BlockHash]) -> None: ...
    def all_cleared(self) -> None: ...


@dataclass
class ComputedBlocks:
    """A request's cached prefix: device blocks to share, lower-tier blocks to load."""

    device: list[KVCacheBlock] = field(default_factory=list)
    loaded: list[tuple[BlockHash, torch.Tensor, str]] = field(default_factory=list)
    block_size: int = 16

    @property
    def num_tokens(self) -> int:
        return (len(self.device) + len(self.loaded)) * self.block_size

    @property
    def num_local_tokens(self) -> int:
        """Cached here (any tier), not transferred from a prefill worker."""
        remote = sum(1 for _, _, medium in self.loaded if medium == MEDIUM_REMOTE)
        return self.num_tokens - remote * self.block_size


@dataclass
class PrefixCacheStats:
    queries: int = 0  # prompt tokens looked up
    hits: int = 0  # of which found cached (any tier)
    hits_by_medium: dict[str, int] = field(default_factory=dict)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = False,
        store: TieredStore | None = None,
        block_io: BlockIO | None = None,
        events: KVEventSink | None = None,
        sliding_window: int | None = None,
    ) -> None:
        """`sliding_window`: the window every layer of the model attends through (None when
        any layer attends to everything): blocks that fall out of it are freed."""
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.enable_caching = enable_caching
        self.store = store if enable_caching else None
        self.block_io = block_io
        self.events = events
        self.pool = BlockPool(num_blocks, on_evict=self._on_evict)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_blocks: dict[str, int] = {}
        self.stats = PrefixCacheStats()
        # blocks a prefill worker computed for a request (by request id), used at admission
        self.received: dict[str, dict[BlockHash, Any]] = {}  # BlockView each

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def get_block_ids(self, request_id: str) -> list[int]:
        """Block ids of the request's table; a block freed out of the sliding window reads as
        block 0 (its keys are masked, any block will do)."""
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    # ------------------------------------------------------------ prefix hits

    def _hashes(self, request: Request) -> list[BlockHash]:
        request.block_hashes = block_hashes(
            request.all_token_ids,
            self.block_size,
            request.cache_salt,
            request.block_hashes,
            request.lora_name,
        )
        return request.block_hashes

    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """The longest cached prefix, leaving at least the last token to compute (a full hit
        must still run one token to produce logits)."""
        found = ComputedBlocks(block_size=self.block_size)
        if (
            not self.enable_caching
            or request.sampling_params.prompt_logprobs is not None
            or request.skip_reading_prefix_cache
        ):
            # prompt logprobs (and mean pooling) need every prompt position computed (as
            # vLLM: no cache reads)
            return found
        hashes = self._hashes(request)
        limit = (request.num_tokens - 1) // self.block_size
        i = 0
        while i < limit and (block := self.pool.lookup(hashes[i])) is not None:
            found.device.append(block)
            i += 1
        received = self.received.get(request.request_id)
        while received and i < limit and (data := received.get(hashes[i])) is not None:
            found.loaded.append((hashes[i], data, MEDIUM_REMOTE))
            i += 1
        while self.store is not None and i < limit:
            hit = self.store.lookup(hashes[i])
            if hit is None:
                break
            found.loaded.append((hashes[i], hit[0], hit[1]))
            i += 1
        return found

    def record_lookup(self, request: Request, found: ComputedBlocks) -> None:
        """Counts a first-time prompt lookup in the prefix-cache stats."""
        self.stats.queries += request.num_prompt_tokens
        self.stats.hits += found.num_local_tokens
        by_medium = self.stats.hits_by_medium
        if found.device:
            by_medium[MEDIUM_DEVICE] = (
                by_medium.get(MEDIUM_DEVICE, 0) + len(found.device) * self.block_size
            )
        for _, _, medium in found.loaded:
            if medium == MEDIUM_REMOTE:
                continue
            by_medium[medium] = by_medium.get(medium, 0) + self.block_size

    # ------------------------------------------------------------ allocation

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens (after the computed prefix, if given).
        False, with nothing changed, when the pool is short."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        if self.sliding_window is not None:
            self._free_outside_window(request, blocks)
        shared = computed.device if computed else []
        loaded = computed.loaded if computed else []
        total_blocks = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        needed = total_blocks - len(blocks) - len(shared)
        reusable_free = sum(
            1 for b in shared if b.ref_cnt == 0
        )  # taking them shrinks the free queue
        if needed > self.pool.num_free_blocks - reusable_free:
            return False
        for block in shared:
            self.pool.touch(block)
        blocks.extend(shared)
        if needed > 0:
            new = self.pool.allocate(needed)
            if loaded:
                assert self.block_io is not None
                pairs = list(zip(new, loaded, strict=False))
                self.block_io.write_blocks([(b.block_id, data) for b, (_, data, _) in pairs])
                for block, (h, _data, _medium) in pairs:
                    if self.pool.cache_block(block, h) and self.events:
                        self.events.block_stored(MEDIUM_DEVICE, [h], None, [])
            blocks.extend(new)
        if shared or loaded:
            self.num_cached_blocks[request.request_id] = len(shared) + len(loaded)
        self.received.pop(request.request_id, None)  # written (or not needed any more)
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """After a step: register the request's newly full blocks under their hashes."""
        if not self.enable_caching:
            return
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid, [])
        start = self.num_cached_blocks.get(rid, 0)
        end = min(request.num_computed_tokens // self.block_size, len(blocks))
        if end <= start:
            return
        hashes = self._hashes(request)
        stored = []
        for i in range(start, end):
            if blocks[i] is not NULL_BLOCK and self.pool.cache_block(blocks[i], hashes[i]):
                stored.append(i)
        self.num_cached_blocks[rid] = end
        if stored and self.events:
            first = stored[0]
            token_ids = request.all_token_ids[
                first * self.block_size : (stored[-1] + 1) * self.block_size
            ]
            parent = hashes[first - 1] if first > 0 else None
            self.events.block_stored(
                MEDIUM_DEVICE, [hashes[i] for i in stored], parent, token_ids, request.lora_id
            )

    def _free_outside_window(self, request: Request, blocks: list[KVCacheBlock]) -> None:
        """Gives back the blocks whose every token is out of the window of the next query
        (position num_computed_tokens attends to the `sliding_window` positions up to it),
        in the table's place a stand-in (vLLM's null block). Full blocks were cached first."""
        first_needed = max(0, request.num_computed_tokens - self.sliding_window + 1)
        out = [i for i in range(min(first_needed // self.block_size, len(blocks)))
               if blocks[i] is not NULL_BLOCK]  # fmt: skip
        if out:
            self.pool.free([blocks[i] for i in reversed(out)])
            for i in out:
                blocks[i] = NULL_BLOCK

    def trim(self, request: Request) -> None:
        """Frees the blocks past the request's computed tokens (after rejected drafts).
        Those blocks were never full of computed tokens, so never cached."""
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        keep = cdiv(request.num_computed_tokens, self.block_size)
        if len(blocks) > keep:
            self.pool.free(list(reversed(blocks[keep:])))
            del blocks[keep:]

    def free(self, request: Request) -> None:
        self.received.pop(request.request_id, None)
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        # Tail first: when cached blocks are evicted later, a prefix's end goes before its start.
        self.pool.free([b for b in reversed(blocks) if b is not NULL_BLOCK])

    def _on_evict(self, block: KVCacheBlock) -> None:
        """A cached device block is about to be overwritten: move it down a tier."""
        assert block.block_hash is not None
        if self.store is not None and self.block_io is not None:
            self.store.offload(block.block_hash, self.block_io.read_block(block.block_id))
        if self.events:
            self.events.block_removed(MEDIUM_DEVICE, [block.block_hash])

    def reset_prefix_cache(self) -> bool:
        if not self.pool.reset_cache():
            return False
        if self.store is not None:
            self.store.clear()
        if self.events:
            self.events.all_cleared()
        return True

    def check_invariants(self) -> None:
        """free + used = total; requests hold exactly the referenced blocks; cache map consistent."""
        self.pool.check_invariants()
        held = sum(b is not NULL_BLOCK for bs in self.req_to_blocks.values() for b in bs)
        referenced = sum(b.ref_cnt for b in self.pool.blocks)
        assert held == referenced, f"requests hold {held} block refs, pool counts {referenced}"
