"""The KV transfer protocol, a DEALER (decode worker) talking to a ROUTER (prefill worker).

Requests, as [kind, msgpack body]:
    [b"PULL", {"transfer_id", "start", "max_blocks", "carrier"}]  blocks from `start` on;
        the server answers once at least one is ready (long poll) or the transfer ended
    [b"RELEASE", {"transfer_id"}]  the puller has what it needs: the lease ends

Replies, as [msgpack header, payload...]:
    {"status": "blocks", "start", "hashes": [16-byte block hash, ...], "layers",
     "block_numel", "dtype", "checksums": [XXH3-64 per layer slice], "shm": None | name}
        payload (tcp): one frame per layer, that layer's K and V of the blocks,
        [2, len(hashes), block_numel] row-major; (shm) none, the slices are laid end to end
        in the shared-memory segment `shm`, which the puller unlinks once read
    {"status": "done", "num_blocks"}  every block was served
    {"status": "failed" | "unknown", "reason"}  the transfer cannot be served
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
import xxhash

PULL = b"PULL"
RELEASE = b"RELEASE"
MAX_REQUEST_BYTES = 4096
MAX_BLOCKS_PER_PULL = 1024
CARRIERS = ("tcp", "shm")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class PullRequest:
    transfer_id: str
    start: int
    max_blocks: int
    carrier: str = "tcp"

    def encode(self) -> list[bytes]:
        body = {
            "transfer_id": self.transfer_id,
            "start": self.start,
            "max_blocks": self.max_blocks,
            "carrier": self.carrier,
        }
        return [PULL, msgpack.packb(body)]


def decode_body(data: bytes) -> dict[str, Any]:
    """A request body from the network: bounded, a map, or ValueError."""
    if len(data) > MAX_REQUEST_BYTES:
        raise ValueError("request too large")
    body = msgpack.unpackb(data, raw=False, strict_map_key=True, max_array_len=16)
    if not isinstance(body, dict):
        raise ValueError("request body must be a map")
    if not isinstance(body.get("transfer_id"), str) or len(body["transfer_id"]) > 128:
        raise ValueError("transfer_id: missing or too long")
    return body


def decode_pull(data: bytes) -> PullRequest:
    body = decode_body(data)
    start, count, carrier = body.get("start"), body.get("max_blocks"), body.get("carrier")
    if type(start) is not int or not 0 <= start < 1 << 31:
        raise ValueError("start: must be a non-negative integer")
    if type(count) is not int or not 1 <= count <= MAX_BLOCKS_PER_PULL:
        raise ValueError(f"max_blocks: must be in [1, {MAX_BLOCKS_PER_PULL}]")
    if carrier not in CARRIERS:
        raise ValueError(f"carrier: one of {CARRIERS}")
    return PullRequest(body["transfer_id"], start, count, carrier)


def release_message(transfer_id: str) -> list[bytes]:
    return [RELEASE, msgpack.packb({"transfer_id": transfer_id})]


def checksum(buf: Any) -> int:
    """XXH3-64 of a frame (several GB/s; a corrupted frame is caught, not an attacker)."""
    return xxhash.xxh3_64_intdigest(buf)


def pack_header(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def unpack_header(data: bytes) -> dict[str, Any]:
    header = msgpack.unpackb(data, raw=False, max_bin_len=64, max_array_len=1 << 16)
    if not isinstance(header, dict) or not isinstance(header.get("status"), str):
        raise ValueError("malformed reply header")
    return header
