"""Lower KV tiers ("KV cache hot potato"): blocks evicted from the device pool move down to a
host-memory pool, and from there to disk, instead of being dropped. A later prefix hit in a
lower tier loads the block back rather than recomputing it.

Tiers are inclusive (a loaded block keeps its lower copy) and each is LRU with a byte cap.
Disk files are written atomically (temp file + rename), carry a sha256 of their payload, and
a file that fails the check (truncated, corrupted) is deleted and treated as a miss.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import struct
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tokenmill.kv.hashing import BlockHash

logger = logging.getLogger(__name__)

MEDIUM_DEVICE, MEDIUM_HOST, MEDIUM_DISK = "device", "host", "disk"

# (medium, stored hashes, removed hashes) -> None; the event publisher listens here.
TierListener = Callable[[str, list[BlockHash], list[BlockHash]], None]


@dataclass
class TierStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    evictions: int = 0
    corrupted: int = 0
    store_failures: int = 0
    bytes_stored: int = 0
    bytes_loaded: int = 0
    # recent latencies only (bounded)
    load_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=1024))
    store_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=1024))

    def snapshot(self) -> dict:
        def pct(xs: deque[float], q: float) -> float:
            return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

        return {
            "hits": self.hits,
            "misses": self.misses,
            "stores": self.stores,
            "evictions": self.evictions,
            "corrupted": self.corrupted,
            "store_failures": self.store_failures,
            "bytes_stored": self.bytes_stored,
            "bytes_loaded": self.bytes_loaded,
            "load_p50_s": pct(self.load_seconds, 0.5),
            "store_p50_s": pct(self.store_seconds, 0.5),
        }


class HostTier:
    """Block payloads in process memory, LRU, capped in bytes."""

    medium = MEDIUM_HOST

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = 0
        self.blocks: OrderedDict[BlockHash, torch.Tensor] = OrderedDict()
        self.stats = TierStats()

    def __contains__(self, h: BlockHash) -> bool:
        return h in self.blocks

    def get(self, h: BlockHash) -> torch.Tensor | None:
        t0 = time.perf_counter()
        data = self.blocks.get(h)
        if data is None:
            self.stats.misses += 1
            return None
        self.blocks.move_to_end(h)
        self.stats.hits += 1
        self.stats.bytes_loaded += data.numel() * data.element_size()
        self.stats.load_seconds.append(time.perf_counter() - t0)
        return data

    def put(self, h: BlockHash, data: torch.Tensor) -> list[tuple[BlockHash, torch.Tensor]]:
        """Stores a copy; returns the entries evicted to make room (oldest first)."""
        size = data.numel() * data.element_size()
        if h in self.blocks or size > self.capacity:
            return []
        t0 = time.perf_counter()
        evicted = []
        while self.used + size > self.capacity:
            old_h, old = self.blocks.popitem(last=False)
            self.used -= old.numel() * old.element_size()
            self.stats.evictions += 1
            evicted.append((old_h, old))
        self.blocks[h] = data.clone()
        self.used += size
        self.stats.stores += 1
        self.stats.bytes_stored += size
        self.stats.store_seconds.append(time.perf_counter() - t0)
        return evicted

    def clear(self) -> list[BlockHash]:
        hashes = list(self.blocks)
        self.blocks.clear()
        self.used = 0
        return hashes


_MAGIC = b"TMKV1\0"
_HEADER = struct.Struct("<6sQ32s")  # magic, payload length, sha256(payload)


class DiskTier:
    """One file per block under `path` (named by the block hash), LRU, capped in bytes."""

    medium = MEDIUM_DISK

    def __init__(
        self,
        path: str | Path,
        capacity_bytes: int,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
    ):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.capacity = capacity_bytes
        self.block_shape = block_shape
        self.dtype = dtype
        self.index: OrderedDict[BlockHash, int] = OrderedDict()  # hash -> file size
        self.used = 0
        self.stats = TierStats()
        self._adopt_existing()

    def _file(self, h: BlockHash) -> Path:
        return self.path / f"{h.hex()}.kv"

    def _adopt_existing(self) -> None:
        """Blocks written by an earlier run of the same model stay usable (oldest first)."""
        for f in sorted(self.path.glob("*.kv"), key=lambda p: p.stat().st_mtime):
            try:
                h = bytes.fromhex(f.stem)
            except ValueError:
                continue
            size = f.stat().st_size
            self.index[h] = size
            self.used += size
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink(missing_ok=True)  # an interrupted write
        self._evict_to(self.capacity)

    def __contains__(self, h: BlockHash) -> bool:
        return h in self.index

    def get(self, h: BlockHash) -> torch.Tensor | None:
        if h not in self.index:
            self.stats.misses += 1
            return None
        t0 = time.perf_counter()
        try:
            raw = self._file(h).read_bytes()
        except OSError:
            self._drop(h)
            self.stats.misses += 1
            return None
        payload = raw[_HEADER.size :]
        ok = len(raw) >= _HEADER.size
        if ok:
            magic, length, digest = _HEADER.unpack_from(raw)
            ok = (
                magic == _MAGIC
                and length == len(payload)
                and hashlib.sha256(payload).digest() == digest
            )
        if not ok:
            logger.warning(
                "KV block file %s failed its checksum: dropped, will recompute", self._file(h).name
            )
            self.stats.corrupted += 1
            self._drop(h)
            return None
        self.index.move_to_end(h)
        data = torch.frombuffer(bytearray(payload), dtype=self.dtype).view(self.block_shape)
        self.stats.hits += 1
        self.stats.bytes_loaded += len(payload)
        self.stats.load_seconds.append(time.perf_counter() - t0)
        return data

    def put(self, h: BlockHash, data: torch.Tensor) -> list[BlockHash]:
        """Writes the block; returns hashes evicted to make room. A failed write (e.g. a full
        disk) is logged and skipped: the block is simply not kept."""
        if h in self.index:
            return []
        t0 = time.perf_counter()
        payload = data.contiguous().view(torch.uint8).numpy().tobytes()
        size = _HEADER.size + len(payload)
        if size > self.capacity:
            return []
        evicted = self._evict_to(self.capacity - size)
        target = self._file(h)
        tmp = target.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, len(payload), hashlib.sha256(payload).digest()))
                f.write(payload)
            os.replace(tmp, target)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.stats.store_failures += 1
            level = logging.WARNING if e.errno in (errno.ENOSPC, errno.EDQUOT) else logging.ERROR
            logger.log(level, "could not write KV block to disk (%s): skipped", e)
            return evicted
        self.index[h] = size
        self.used += size
        self.stats.stores += 1
        self.stats.bytes_stored += len(payload)
        self.stats.store_seconds.append(time.perf_counter() - t0)
        return evicted

    def _evict_to(self, limit: int) -> list[BlockHash]:
        evicted = []
        while self.index and self.used > limit:
            h = next(iter(self.index))
            self._drop(h)
            self.stats.evictions += 1
            evicted.append(h)
        return evicted

    def _drop(self, h: BlockHash) -> None:
        size = self.index.pop(h, 0)
        self.used -= size
        self._file(h).unlink(missing_ok=True)

    def clear(self) -> list[BlockHash]:
        hashes = list(self.index)
        for h in hashes:
            self._drop(h)
        return hashes


class TieredStore:
    """The tiers below the device pool, in order (host, then disk)."""

    def __init__(
        self, host: HostTier | None, disk: DiskTier | None, listener: TierListener | None = None
    ):
        self.host = host
        self.disk = disk
        self.listener = listener

    @property
    def tiers(self) -> list[HostTier | DiskTier]:
        return [t for t in (self.host, self.disk) if t is not None]

    def _emit(self, medium: str, stored: list[BlockHash], removed: list[BlockHash]) -> None:
        if self.listener and (stored or removed):
            self.listener(medium, stored, removed)

    def offload(self, h: BlockHash, data: torch.Tensor) -> None:
        """A block leaves the device pool: keep it in the highest tier that has room."""
        if self.host is not None:
            if h in self.host:
                return
            demoted = self.host.put(h, data)
            self._emit(MEDIUM_HOST, [h] if h in self.host else [], [d for d, _ in demoted])
            for old_h, old in demoted:
                self._to_disk(old_h, old)
        else:
            self._to_disk(h, data)

    def _to_disk(self, h: BlockHash, data: torch.Tensor) -> None:
        if self.disk is None or h in self.disk:
            return
        removed = self.disk.put(h, data)
        self._emit(MEDIUM_DISK, [h] if h in self.disk else [], removed)

    def lookup(self, h: BlockHash) -> tuple[torch.Tensor, str] | None:
        for tier in self.tiers:
            if h in tier:
                data = tier.get(h)
                if data is not None:
                    return data, tier.medium
                if tier is self.disk:  # failed its checksum and was dropped
                    self._emit(MEDIUM_DISK, [], [h])
        return None

    def clear(self) -> None:
        for tier in self.tiers:
            self._emit(tier.medium, [], tier.clear())

    def stats(self) -> dict[str, dict]:
        return {tier.medium: tier.stats.snapshot() for tier in self.tiers}
