"""How a chunk of blocks travels: TCP frames (one per layer, sent without a copy by ZMQ) or a
shared-memory segment on the same host (one copy in, one copy out, no socket traffic).

Both read a chunk out of the KV pool the same way, layer by layer: layer l's slice is
`kv_caches[l][:, block_ids]`, shape [2, n, block_numel], checksummed with XXH3-64.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import warnings
from typing import Any

import torch

from tokenmill.kv.connector.wire import DTYPES, checksum

# received frames and mappings are read-only; the views into them are only ever read
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)

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
    """Layer slices as new contiguous tensors in host memory (ZMQ sends them as they are),
    and their checksums."""
    ids = torch.tensor(block_ids, device=kv_caches[0].device)
    slices = [kv.index_select(1, ids).to("cpu") for kv in kv_caches]
    return slices, [checksum(_bytes_view(s)) for s in slices]


def read_chunk_shm(kv_caches: list[torch.Tensor], block_ids: list[int]) -> tuple[str, list[int]]:
    """Layer slices written end to end into a new shared-memory segment: (its name, checksums)."""
    ids = torch.tensor(block_ids, device=kv_caches[0].device)
    first = kv_caches[0]
    per_layer = 2 * len(block_ids) * first.shape[2] * first.element_size()
    name = _SHM_PREFIX + secrets.token_hex(12)
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    sums = []
    try:
        os.ftruncate(fd, per_layer * len(kv_caches))
        with mmap.mmap(fd, per_layer * len(kv_caches)) as mem:
            flat = torch.frombuffer(mem, dtype=first.dtype)
            step = per_layer // first.element_size()
            for layer, kv in enumerate(kv_caches):
                out = flat[layer * step : (layer + 1) * step].view(2, len(block_ids), -1)
                if kv.device.type == "cpu":
                    torch.index_select(kv, 1, ids, out=out)
                else:  # GPU blocks: gathered there, copied down once
                    out.copy_(kv.index_select(1, ids))
                sums.append(checksum(memoryview(mem)[layer * per_layer : (layer + 1) * per_layer]))
            del flat, out
    except BaseException:
        unlink_segment(name)
        raise
    finally:
        os.close(fd)
    return name, sums


def unlink_segment(name: str) -> None:
    if not name.startswith(_SHM_PREFIX) or "/" in name:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(SHM_DIR, name))


def _bytes_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


class BlockView:
    """Block j of a received chunk as `BlockIO.write_block` reads it (`view[layer]`: that
    layer's [2, block_numel] K and V), without a copy: it points into the chunk's frames
    (or its shared-memory mapping), which it keeps alive until the block is written."""

    __slots__ = ("layers", "j")

    def __init__(self, layers: list[torch.Tensor], j: int) -> None:
        self.layers = layers
        self.j = j

    def __getitem__(self, layer: int) -> torch.Tensor:
        return self.layers[layer][:, self.j]

    def __len__(self) -> int:
        return len(self.layers)


def assemble(header: dict[str, Any], frames: list[Any]) -> list[BlockView]:
    """The chunk's blocks, each checked layer slice viewed in place (XXH3-64 per slice).
    Raises TransferError on anything inconsistent."""
    try:
        n, layers, numel = len(header["hashes"]), int(header["layers"]), int(header["block_numel"])
        dtype, sums, shm = header["dtype"], header["checksums"], header.get("shm")
    except (KeyError, TypeError, ValueError) as e:
        raise TransferError("protocol", f"bad chunk header: {e}") from None
    if dtype not in DTYPES or not (n > 0 and 0 < layers <= 4096 and 0 < numel <= 1 << 24):
        raise TransferError("protocol", "chunk header out of range")
    if not isinstance(sums, list) or len(sums) != layers:
        raise TransferError("protocol", "one checksum per layer expected")
    torch_dtype = getattr(torch, dtype)
    per_layer = 2 * n * numel * torch.empty((), dtype=torch_dtype).element_size()
    if shm is None:
        if len(frames) != layers:
            raise TransferError("protocol", f"{len(frames)} frames for {layers} layers")
        buffers = [f.buffer if hasattr(f, "buffer") else memoryview(f) for f in frames]
    else:
        whole = _map_segment(shm, per_layer * layers)
        buffers = [whole[i * per_layer : (i + 1) * per_layer] for i in range(layers)]
    slices = []
    for layer, (buf, want) in enumerate(zip(buffers, sums, strict=True)):
        if len(buf) != per_layer:
            raise TransferError(
                "protocol", f"layer {layer}: {len(buf)} bytes, {per_layer} expected"
            )
        if checksum(buf) != want:
            raise TransferError(
                "checksum", f"layer {layer} of the blocks from {header.get('start')}"
            )
        slices.append(torch.frombuffer(buf, dtype=torch_dtype).view(2, n, numel))
    return [BlockView(slices, j) for j in range(n)]


def _map_segment(name: Any, size: int) -> memoryview:
    """A segment mapped read-only and unlinked at once: the mapping lives as long as the
    views into it (the server unlinks leftovers of failed transfers at lease end)."""
    if not isinstance(name, str) or not name.startswith(_SHM_PREFIX) or "/" in name:
        raise TransferError("protocol", "bad shared-memory segment name")
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
    except OSError as e:
        raise TransferError("shm", f"{type(e).__name__}: {e}") from None
    try:
        if os.fstat(fd).st_size != size:
            raise TransferError("protocol", "shared-memory segment of the wrong size")
        return memoryview(mmap.mmap(fd, size, prot=mmap.PROT_READ))
    finally:
        os.close(fd)
        unlink_segment(name)
