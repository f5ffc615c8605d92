"""How a chunk of blocks travels: TCP frames (one per layer, sent without a copy by ZMQ) or a
shared-memory segment on the same host (one copy in, one copy out, no socket traffic).

Both read a chunk out of the KV pool the same way, layer by layer: layer l's slice is
`kv_caches[l][:, block_ids]`, shape [2, n, block_numel], checksummed with CRC-32.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from typing import Any

import numpy as np
import torch

from tokenmill.kv.connector.wire import DTYPES, checksum

SHM_DIR = "/dev/shm"
_SHM_PREFIX = "tokenmill-kv-"


class TransferError(RuntimeError):
    """A transfer that cannot complete; `reason` is a short label for metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def shm_available() -> bool:
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"KV dtype {name} cannot be transferred")
    return name


def read_chunk_tcp(
    kv_caches: list[torch.Tensor], block_ids: list[int]
) -> tuple[list[torch.Tensor], list[int]]:
    """Layer slices as new contiguous tensors (ZMQ sends them as they are), and their CRCs."""
    ids = torch.tensor(block_ids, dtype=torch.long)
    slices = [kv.index_select(1, ids) for kv in kv_caches]
    return slices, [checksum(_bytes_view(s)) for s in slices]


def read_chunk_shm(kv_caches: list[torch.Tensor], block_ids: list[int]) -> tuple[str, list[int]]:
    """Layer slices written end to end into a new shared-memory segment: (its name, CRCs)."""
    ids = torch.tensor(block_ids, dtype=torch.long)
    first = kv_caches[0]
    per_layer = 2 * len(block_ids) * first.shape[2] * first.element_size()
    name = _SHM_PREFIX + secrets.token_hex(12)
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    crcs = []
    try:
        os.ftruncate(fd, per_layer * len(kv_caches))
        with mmap.mmap(fd, per_layer * len(kv_caches)) as mem:
            flat = torch.frombuffer(mem, dtype=first.dtype)
            step = per_layer // first.element_size()
            for layer, kv in enumerate(kv_caches):
                out = flat[layer * step : (layer + 1) * step].view(2, len(block_ids), -1)
                torch.index_select(kv, 1, ids, out=out)
                crcs.append(checksum(memoryview(mem)[layer * per_layer : (layer + 1) * per_layer]))
            del flat, out
    except BaseException:
        unlink_segment(name)
        raise
    finally:
        os.close(fd)
    return name, crcs


def unlink_segment(name: str) -> None:
    if not name.startswith(_SHM_PREFIX) or "/" in name:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def _bytes_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def assemble(header: dict[str, Any], frames: list[Any]) -> torch.Tensor:
    """Rebuilds a chunk as [n, layers, 2, block_numel] (each block as `BlockIO` writes it),
    checking every layer slice's CRC. Raises TransferError on anything inconsistent."""
    try:
        n, layers, numel = len(header["hashes"]), int(header["layers"]), int(header["block_numel"])
        dtype, crcs, shm = header["dtype"], header["crc"], header.get("shm")
    except (KeyError, TypeError, ValueError) as e:
        raise TransferError("protocol", f"bad chunk header: {e}") from None
    if dtype not in DTYPES or not (n > 0 and 0 < layers <= 4096 and 0 < numel <= 1 << 24):
        raise TransferError("protocol", "chunk header out of range")
    if not isinstance(crcs, list) or len(crcs) != layers:
        raise TransferError("protocol", "one CRC per layer expected")
    torch_dtype = getattr(torch, dtype)
    elem = torch.empty((), dtype=torch_dtype).element_size()
    per_layer = 2 * n * numel * elem
    out = torch.empty((n, layers, 2, numel), dtype=torch_dtype)
    target = out.view(torch.uint8).numpy().reshape(n, layers, 2, -1)
    if shm is None:
        if len(frames) != layers:
            raise TransferError("protocol", f"{len(frames)} frames for {layers} layers")
        _fill(target, [memoryview(f) for f in frames], crcs, per_layer, header.get("start"))
        return out
    if not isinstance(shm, str) or not shm.startswith(_SHM_PREFIX) or "/" in shm:
        raise TransferError("protocol", "bad shared-memory segment name")
    try:
        fd = os.open(os.path.join(SHM_DIR, shm), os.O_RDONLY)
    except OSError as e:
        raise TransferError("shm", f"{type(e).__name__}: {e}") from None
    try:
        if os.fstat(fd).st_size != per_layer * layers:
            raise TransferError("protocol", "shared-memory segment of the wrong size")
        with mmap.mmap(fd, per_layer * layers, prot=mmap.PROT_READ) as mem:
            whole = memoryview(mem)
            views = [whole[i * per_layer : (i + 1) * per_layer] for i in range(layers)]
            try:
                _fill(target, views, crcs, per_layer, header.get("start"))
            finally:
                for v in views:
                    v.release()
                whole.release()
    finally:
        os.close(fd)
        unlink_segment(shm)
    return out


def _fill(target: np.ndarray, views: list[memoryview], crcs: list, per_layer: int,
          start: Any) -> None:  # fmt: skip
    n = target.shape[0]
    for layer, (view, crc) in enumerate(zip(views, crcs, strict=True)):
        if len(view) != per_layer:
            raise TransferError(
                "protocol", f"layer {layer}: {len(view)} bytes, {per_layer} expected"
            )
        if checksum(view) != crc:
            raise TransferError("checksum", f"layer {layer} of the blocks from {start}")
        src = np.frombuffer(view, dtype=np.uint8).reshape(2, n, -1)
        target[:, layer] = src.transpose(1, 0, 2)
