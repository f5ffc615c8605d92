"""Prefill side, scheduler half: which blocks of which request are served under which
transfer id, and the lease that keeps them after the request finished.

Runs on the engine thread; the block server thread reads the same records under `lock`.
Blocks are only ever freed or reused on the engine thread while it holds `lock`, so a read
in progress never sees a block change under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenmill.kv.connector.carriers import unlink_segment
from tokenmill.kv.connector.params import KVTransferParams
from tokenmill.kv.connector.stats import KVTransferStats
from tokenmill.kv.hashing import BlockHash, block_hashes
from tokenmill.kv.manager import KVCacheManager
from tokenmill.request import Request

logger = logging.getLogger(__name__)

_ENDED_KEPT = 4096  # ended transfer ids remembered, to answer late pulls


def prompt_block_hashes(request: Request, block_size: int) -> list[BlockHash]:
    """The prompt's full-block hashes, kept on the request: the KV manager extends the same
    list when it looks the request up, so the prompt is hashed once."""
    request.block_hashes = block_hashes(
        request.prompt_token_ids, block_size, request.cache_salt, request.block_hashes
    )
    return request.block_hashes


def served_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full prompt blocks a decode worker can use: it always computes the last prompt token."""
    return max(0, (num_prompt_tokens - 1) // block_size)


@dataclass
class OutboundTransfer:
    transfer_id: str
    request: Request
    hashes: list[BlockHash]  # of every block that will be served
    block_ids: list[int] = field(default_factory=list)  # the ready ones, in order
    finished: bool = False  # the prefill is done; the lease runs
    lease_deadline: float = float("inf")
    released: bool = False  # the puller confirmed
    segments: set[str] = field(default_factory=set)  # shared memory not yet unlinked


class KVProducer:
    def __init__(
        self,
        kv: KVCacheManager,
        lease_timeout_s: float,
        stats: KVTransferStats,
        wake_engine: Callable[[], None],
    ) -> None:
        self.kv = kv
        self.block_size = kv.block_size
        self.lease_timeout_s = lease_timeout_s
        self.stats = stats
        self.wake_engine = wake_engine  # a release arrived (server thread)
        self.notify_server: Callable[[], None] = lambda: None  # blocks became ready
        self.lock = threading.Lock()
        self.active: dict[str, OutboundTransfer] = {}
        self.by_request: dict[str, str] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # transfer id -> why
        # released before registered (the puller had every block already)
        self.early_releases: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------ engine thread

    def register(self, request: Request, params: KVTransferParams) -> None:
        tid = params.transfer_id
        with self.lock:
            if tid in self.active or tid in self.ended:
                raise ValueError(f"kv_transfer_params.transfer_id: {tid!r} is already in use")
            n = served_blocks(request.num_prompt_tokens, self.block_size)
            hashes = prompt_block_hashes(request, self.block_size)[:n]
            self.active[tid] = OutboundTransfer(tid, request, hashes)
            self.by_request[request.request_id] = tid
            if tid in self.early_releases:
                del self.early_releases[tid]
                self.active[tid].released = True
        self.notify_server()

    def after_step(self) -> None:
        """Publishes the blocks that the last step completed."""
        changed = False
        with self.lock:
            for t in self.active.values():
                if t.finished:
                    continue
                ready = min(t.request.num_computed_tokens // self.block_size, len(t.hashes))
                if ready > len(t.block_ids):
                    t.block_ids = self.kv.get_block_ids(t.request.request_id)[:ready]
                    changed = True
        if changed:
            self.notify_server()

    def request_finished(self, request: Request) -> bool:
        """The prefill is done: True keeps its blocks (the lease), False frees them now."""
        tid = self.by_request.get(request.request_id)
        if tid is None:
            return False
        with self.lock:
            t = self.active[tid]
            ready = min(request.num_computed_tokens // self.block_size, len(t.hashes))
            t.block_ids = self.kv.get_block_ids(request.request_id)[:ready]
            t.finished = True
            t.lease_deadline = time.monotonic() + self.lease_timeout_s
        self.notify_server()
        return True

    def blocks_lost(self, request: Request, why: str) -> None:
        """The request's blocks are about to be freed (abort, failure, preemption)."""
        tid = self.by_request.get(request.request_id)
        if tid is None:
            return
        with self.lock:
            self._end(tid, why)
            self.stats.transfers_dropped += 1
        self.notify_server()

    def poll(self) -> None:
        """Ends released and expired leases: their blocks go back to the prefix cache."""
        now = time.monotonic()
        with self.lock:
            for tid, t in list(self.active.items()):
                if t.released:
                    self.stats.transfers_served += 1
                    why = "released"
                elif t.finished and now >= t.lease_deadline:
                    self.stats.leases_expired += 1
                    why = "lease expired"
                    logger.warning("transfer %s: lease expired, blocks freed", tid)
                else:
                    continue
                self._end(tid, why)
                if t.finished:  # else it runs on and the scheduler frees it as usual
                    self.kv.free(t.request)

    def next_deadline(self) -> float | None:
        with self.lock:
            return min((t.lease_deadline for t in self.active.values() if t.finished),
                       default=None)  # fmt: skip

    def _end(self, tid: str, why: str) -> None:
        t = self.active.pop(tid)
        self.by_request.pop(t.request.request_id, None)
        self.ended[tid] = why
        while len(self.ended) > _ENDED_KEPT:
            self.ended.popitem(last=False)
        for name in t.segments:
            unlink_segment(name)

    # ------------------------------------------------------------ server thread

    def release(self, tid: str) -> None:
        with self.lock:
            t = self.active.get(tid)
            if t is None:
                if tid not in self.ended:
                    self.early_releases[tid] = None
                    while len(self.early_releases) > _ENDED_KEPT:
                        self.early_releases.popitem(last=False)
                return
            t.released = True
        self.wake_engine()

    def leased_blocks(self) -> int:
        with self.lock:
            return sum(len(self.kv.get_block_ids(t.request.request_id))
                       for t in self.active.values() if t.finished)  # fmt: skip
