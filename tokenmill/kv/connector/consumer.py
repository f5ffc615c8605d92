"""Decode side, scheduler half: a request whose prompt was prefilled elsewhere waits here
(parked, outside the scheduler) while a thread pulls its blocks; then it enters the
scheduler with the blocks handed to the KV manager, which counts them as computed.

A failed load is recomputed locally (`load_failure_policy="recompute"`) or fails the
request ("fail"). An abort while parked cancels the pull.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import zmq

from tokenmill.config import KVTransferConfig
from tokenmill.kv.connector.carriers import TransferError, shm_available
from tokenmill.kv.connector.client import PulledBlocks, pull_blocks
from tokenmill.kv.connector.params import KVTransferParams
from tokenmill.kv.connector.producer import prompt_block_hashes, served_blocks
from tokenmill.kv.connector.stats import KVTransferStats
from tokenmill.kv.manager import KVCacheManager
from tokenmill.request import Request

logger = logging.getLogger(__name__)

# transfers at once; more wait their turn. A pull waits on the prefill worker as its prompt
# is computed (tens of seconds for a long one on a CPU), so a few long prompts must not hold
# every slot while short prompts' blocks are ready (4 did: short prompts' first tokens
# waited for a long one's whole prefill)
_MAX_PULLS = 32


@dataclass
class _Parked:
    request: Request
    params: KVTransferParams
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class LoadResult:
    request: Request
    error: TransferError | None = None  # None: loaded (maybe nothing, if all was cached)


def is_local_endpoint(endpoint: str) -> bool:
    return _is_local_host(urlsplit(endpoint).hostname or "")


@functools.lru_cache(maxsize=256)
def _is_local_host(host: str) -> bool:
    """Loopback or one of this host's addresses (resolved once per host, not per request)."""
    if host == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host == socket.gethostname()
    if addr.is_loopback:
        return True
    try:
        return host in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False


class KVConsumer:
    def __init__(
        self,
        config: KVTransferConfig,
        kv: KVCacheManager,
        stats: KVTransferStats,
        wake_engine: Callable[[], None],
        ctx: zmq.Context,
    ) -> None:
        self.config = config
        self.kv = kv
        self.stats = stats
        self.wake_engine = wake_engine
        self.ctx = ctx
        self.parked: dict[str, _Parked] = {}
        self.done: deque[tuple[str, PulledBlocks | TransferError]] = deque()
        self.pool = ThreadPoolExecutor(_MAX_PULLS, thread_name_prefix="kv-pull")

    def carrier(self, endpoint: str) -> str:
        if self.config.carrier != "auto":
            return self.config.carrier
        return "shm" if shm_available() and is_local_endpoint(endpoint) else "tcp"

    def park(self, request: Request, params: KVTransferParams) -> None:
        bs = self.kv.block_size
        n = served_blocks(request.num_prompt_tokens, bs)
        hashes = prompt_block_hashes(request, bs)[:n]
        local = 0
        while local < n and self.kv.pool.lookup(hashes[local]) is not None:
            local += 1  # already here: only the rest travels
        parked = _Parked(request, params)
        self.parked[request.request_id] = parked
        deadline = time.monotonic() + self.config.transfer_timeout_s
        carrier = self.carrier(params.remote_endpoint or "")

        def run() -> None:
            try:
                result: PulledBlocks | TransferError = pull_blocks(
                    self.ctx, params.remote_endpoint or "", params.transfer_id, hashes[local:],
                    local, carrier, self.config.chunk_blocks, deadline, parked.cancel,
                )  # fmt: skip
            except TransferError as e:
                result = e
            except Exception as e:  # a bug must not leave the request parked forever
                logger.exception("transfer %s failed", params.transfer_id)
                result = TransferError("internal", f"{type(e).__name__}: {e}")
            self.done.append((request.request_id, result))
            self.wake_engine()

        self.pool.submit(run)

    def cancel(self, request_id: str) -> bool:
        parked = self.parked.pop(request_id, None)
        if parked is None:
            return False
        parked.cancel.set()
        return True

    def poll(self) -> list[LoadResult]:
        """Requests whose transfer ended, their blocks handed to the KV manager."""
        out = []
        while self.done:
            rid, result = self.done.popleft()
            parked = self.parked.pop(rid, None)
            if parked is None:
                continue  # aborted meanwhile
            if isinstance(result, TransferError):
                self.stats.failed(result.reason)
                logger.warning("request %s: KV load failed (%s)", rid, result)
                if self.config.load_failure_policy == "recompute":
                    self.stats.fallbacks += 1
                out.append(LoadResult(parked.request, result))
                continue
            self.stats.transfers_received += 1
            self.stats.blocks_received += len(result.blocks)
            self.stats.bytes_received += result.num_bytes
            self.stats.receive_seconds += result.seconds
            if result.blocks:
                self.kv.received[rid] = dict(result.blocks)
            out.append(LoadResult(parked.request))
        return out

    @property
    def num_parked(self) -> int:
        return len(self.parked)

    def shutdown(self) -> None:
        for parked in self.parked.values():
            parked.cancel.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
