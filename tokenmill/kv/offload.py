"""Lower KV tiers ("KV cache hot potato"): blocks evicted from the device pool move down to a
host-memory pool, and from there to disk, instead of being dropped. A later prefix hit in a
lower tier loads the block back rather than recomputing it.

Tiers are inclusive (a loaded block keeps its lower copy) and each is LRU with a byte cap.
Disk files (owner-only, written atomically: temp file + rename) are a header (magic
"TMKV2\0", the block hash, a layout id = sha256 of model fingerprint + block shape + dtype,
the payload length), sha256(header + payload), then the payload. A file that fails any check
(size, header naming another block/model/layout, digest) is deleted and treated as a miss.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import os
import stat
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


_MAGIC = b"TMKV2\0"
# magic, block hash (16 bytes), layout id, payload length; sha256(header + payload) follows
_HEADER = struct.Struct("<6s16s32sQ")
_DIGEST_SIZE = 32
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class CorruptBlock(ValueError):
    """A block file that must not be loaded."""


def _private_dir(path: Path) -> None:
    """Creates `path` with mode exactly 0700 (mkdir's mode is cut by the umask; an earlier
    version left 0755), unless someone else owns it."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)


def _remove(path: Path) -> None:
    """Deletes a block or temp file; one that can't be deleted (e.g. a directory in its place)
    is only logged: the tier forgets it all the same."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        logger.warning("could not delete %s: %s", path, e)


def _create_private(path: str, flags: int) -> int:
    """Opener for a temp file: owner-only, never an existing file or a planted symlink."""
    return os.open(path, flags | os.O_EXCL, 0o600)


class DiskTier:
    """One file per block under `path` (named by the block hash), LRU, capped in bytes.

    `fingerprint` names the model (weights, quantization, dtypes, block size): a file written
    for another model or block layout, or for another block, fails the header check."""

    medium = MEDIUM_DISK

    def __init__(
        self,
        path: str | Path,
        capacity_bytes: int,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
        fingerprint: str,
    ):
        self.path = Path(path)
        _private_dir(self.path)
        self.capacity = capacity_bytes
        self.block_shape = block_shape
        self.dtype = dtype
        self.layout_id = hashlib.sha256(
            repr((fingerprint, tuple(block_shape), str(dtype))).encode()
        ).digest()
        self.block_bytes = math.prod(block_shape) * dtype.itemsize
        self.file_size = _HEADER.size + _DIGEST_SIZE + self.block_bytes
        self.index: OrderedDict[BlockHash, int] = OrderedDict()  # hash -> file size
        self.used = 0
        self.stats = TierStats()
        self._adopt_existing()

    def _file(self, h: BlockHash) -> Path:
        return self.path / f"{h.hex()}.kv"

    def _adopt_existing(self) -> None:
        """Blocks written by an earlier run of the same model stay usable (oldest first).
        Only sizes are checked here (a stat each); contents are checked when loaded."""
        found = []
        for f in self.path.iterdir():
            if f.suffix == ".tmp":
                _remove(f)  # an interrupted write
                continue
            if f.suffix != ".kv":
                continue
            try:
                h = bytes.fromhex(f.stem)
                st = f.lstat()
            except (ValueError, OSError):
                continue
            if stat.S_ISREG(st.st_mode) and st.st_size == self.file_size:
                found.append((st.st_mtime, h))
                continue
            logger.warning("KV block file %s has the wrong size or type: deleted", f.name)
            self.stats.corrupted += 1
            _remove(f)
        for _, h in sorted(found):
            self.index[h] = self.file_size
            self.used += self.file_size
        self._evict_to(self.capacity)

    def __contains__(self, h: BlockHash) -> bool:
        return h in self.index

    def _header(self, h: BlockHash, payload_len: int) -> bytes:
        return _HEADER.pack(_MAGIC, h, self.layout_id, payload_len)

    def _header_problem(self, header: bytes, h: BlockHash) -> str:
        """Why a header differs from the one block h's file must have (for the log)."""
        magic, _, layout, length = _HEADER.unpack(header)
        if magic != _MAGIC:
            return "not a KV block file of this format"
        if layout != self.layout_id:
            return "written for another model or block layout"
        if length != self.block_bytes:
            return f"header says {length} payload bytes, expected {self.block_bytes}"
        return f"it holds another block, not {h.hex()}"

    def _load(self, h: BlockHash) -> torch.Tensor:
        """The block's tensor; raises CorruptBlock (or OSError) for a file that doesn't check."""
        fd = os.open(self._file(h), os.O_RDONLY | _O_NOFOLLOW)
        with open(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != self.file_size:
                raise CorruptBlock(f"size {st.st_size}, expected {self.file_size}")
            raw = f.read(self.file_size + 1)
        if len(raw) != self.file_size:
            raise CorruptBlock(f"read {len(raw)} bytes, expected {self.file_size}")
        header = raw[: _HEADER.size]
        if header != self._header(h, self.block_bytes):
            raise CorruptBlock(self._header_problem(header, h))
        payload = bytearray(raw[_HEADER.size + _DIGEST_SIZE :])
        digest = hashlib.sha256(header)
        digest.update(payload)
        if digest.digest() != raw[_HEADER.size : _HEADER.size + _DIGEST_SIZE]:
            raise CorruptBlock("checksum mismatch")
        return torch.frombuffer(payload, dtype=self.dtype).view(self.block_shape)

    def get(self, h: BlockHash) -> torch.Tensor | None:
        """The block, or None (a miss). A file that fails a check is deleted and counted in
        `stats.corrupted`; nothing about a file's contents can raise out of here."""
        if h not in self.index:
            self.stats.misses += 1
            return None
        t0 = time.perf_counter()
        try:
            data = self._load(h)
        except FileNotFoundError:
            self._drop(h)
            self.stats.misses += 1
            return None
        except Exception as e:  # whatever is wrong with a file costs a recompute, not the engine
            logger.warning(
                "KV block file %s is unusable (%s): dropped, will recompute", self._file(h).name, e
            )
            self.stats.corrupted += 1
            self._drop(h)
            return None
        self.index.move_to_end(h)
        self.stats.hits += 1
        self.stats.bytes_loaded += self.block_bytes
        self.stats.load_seconds.append(time.perf_counter() - t0)
        return data

    def put(self, h: BlockHash, data: torch.Tensor) -> list[BlockHash]:
        """Writes the block; returns hashes evicted to make room. A failed write (e.g. a full
        disk) is logged and skipped: the block is simply not kept."""
        if h in self.index:
            return []
        t0 = time.perf_counter()
        payload = data.contiguous().view(torch.uint8).numpy().tobytes()
        header = self._header(h, len(payload))
        size = len(header) + _DIGEST_SIZE + len(payload)
        if size > self.capacity:
            return []
        evicted = self._evict_to(self.capacity - size)
        target = self._file(h)
        tmp = target.with_suffix(".tmp")
        try:
            with open(tmp, "wb", opener=_create_private) as f:
                digest = hashlib.sha256(header)
                digest.update(payload)
                f.write(header + digest.digest())
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
        _remove(self._file(h))

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
        return {
            tier.medium: {
                **tier.stats.snapshot(),
                "used_bytes": tier.used,
                "capacity_bytes": tier.capacity,
            }
            for tier in self.tiers
        }
