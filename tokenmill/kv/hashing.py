"""Chained block hashes for prefix caching.

A full block's hash covers its parent's hash, its token ids and extra keys (a per-request
`cache_salt` enters the first block, so tenants with different salts never share a block).
The scheme is plain sha256 over little-endian bytes so a router can compute the same hashes:

    hash_i = sha256(hash_{i-1} or 16 zero bytes || int32le(token_ids_i) || extra_i)[:16]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

BlockHash = bytes  # 16 bytes
_ROOT = bytes(16)


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra: bytes = b"") -> BlockHash:
    h = hashlib.sha256(parent or _ROOT)
    h.update(np.asarray(token_ids, dtype="<i4").tobytes())
    h.update(extra)
    return h.digest()[:16]


def salt_key(cache_salt: str | None, lora_name: str | None = None) -> bytes:
    """The first block's extra key: the tenant's salt and the LoRA adapter (the same prompt
    under two adapters, or an adapter and the base, never shares a block)."""
    salt = b"salt:" + cache_salt.encode() if cache_salt else b""
    return salt + (b"lora:" + lora_name.encode() if lora_name else b"")


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None = None,
    known: Sequence[BlockHash] = (),
    lora_name: str | None = None,
) -> list[BlockHash]:
    """Hashes of every full block of token_ids, extending `known` (a prefix already hashed)."""
    hashes = list(known)
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        extra = salt_key(cache_salt, lora_name) if i == 0 else b""
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], extra))
    return hashes


def external_hash(h: BlockHash) -> int:
    """The 64-bit integer form used in KV events (vLLM's ExternalBlockHash as int)."""
    return int.from_bytes(h[:8], "little", signed=False)
