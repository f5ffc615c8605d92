"""One KV event batch (vLLM's array-like encoding, see tokenmill.kv.events), decoded and
checked whole before any of it reaches the index: a malformed batch is refused as a unit,
so it can never leave half of its events applied."""

from __future__ import annotations

from typing import Any

import msgpack

Event = list[Any]


class BadBatch(ValueError):
    """Undecodable, or not [ts, [event, ...]] with well-typed events."""


def _hashes(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(h, int) and not isinstance(h, bool) for h in value
    )


def _medium(ev: Event, i: int) -> bool:
    return len(ev) <= i or ev[i] is None or isinstance(ev[i], str)


def _valid(ev: Any) -> bool:
    if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
        return False
    kind = ev[0]
    if kind == "BlockStored":
        return len(ev) >= 2 and _hashes(ev[1]) and _medium(ev, 6)
    if kind == "BlockRemoved":
        return len(ev) >= 2 and _hashes(ev[1]) and _medium(ev, 2)
    return True  # AllBlocksCleared, or a kind from a newer vLLM: the index skips it


def decode_events(payload: bytes) -> list[Event]:
    """The batch's events; raises BadBatch."""
    try:
        batch = msgpack.unpackb(payload)
    except Exception as e:  # msgpack raises many types (ExtraData, FormatError, ValueError...)
        raise BadBatch(f"undecodable ({type(e).__name__})") from e
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise BadBatch("not [ts, [event, ...]]")
    for i, ev in enumerate(batch[1]):
        if not _valid(ev):
            raise BadBatch(f"event {i} is malformed: {str(ev)[:100]}")
    return batch[1]
