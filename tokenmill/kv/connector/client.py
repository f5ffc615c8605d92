"""Decode side, worker half: pulls a transfer's blocks, checks them, confirms.

Two pulls are kept in flight, so the next chunk travels while the last one is checked and
laid out. Every frame's checksum and every block's hash (against the hashes the decode worker
computed from its own prompt) must match; anything else is a TransferError.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from threading import Event

import zmq

from tokenmill.kv.connector.carriers import BlockView, TransferError, assemble
from tokenmill.kv.connector.wire import PullRequest, release_message, unpack_header
from tokenmill.kv.hashing import BlockHash

_POLL_MS = 100  # how often a waiting pull checks for cancellation
_IN_FLIGHT = 2
SILENCE_S = 5.0  # no reply for this long: the prefill worker is gone


@dataclass
class PulledBlocks:
    blocks: list[tuple[BlockHash, BlockView]]
    num_bytes: int
    seconds: float


def pull_blocks(
    ctx: zmq.Context,
    endpoint: str,
    transfer_id: str,
    expected: list[BlockHash],
    start: int,
    carrier: str,
    chunk_blocks: int,
    deadline: float,
    cancel: Event,
    unknown_grace_s: float = 10.0,
) -> PulledBlocks:
    """Blocks [start, start + len(expected)) of the transfer (fewer if the prefill worker
    served fewer: a shorter prefix is still valid). Sends the release when done."""
    t0 = time.monotonic()
    end = start + len(expected)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 500)  # the release goes out even as the socket closes
    sock.connect(endpoint)
    chunks: dict[int, tuple[list[BlockHash], list[BlockView]]] = {}
    in_flight: set[int] = set()
    next_start = start
    num_bytes = 0

    def ask(at: int) -> None:
        n = min(chunk_blocks, end - at)
        sock.send_multipart(PullRequest(transfer_id, at, n, carrier).encode())
        in_flight.add(at)

    try:
        while True:
            while len(in_flight) < _IN_FLIGHT and next_start < end:
                ask(next_start)
                next_start += chunk_blocks
            if not in_flight:
                break
            frames = _receive(sock, deadline, cancel)
            header = unpack_header(frames[0])
            at, status = header.get("start"), header["status"]
            if at not in in_flight:
                raise TransferError(status if status == "failed" else "protocol",
                                    str(header.get("reason", f"reply for {at}"))[:200])  # fmt: skip
            in_flight.discard(at)
            if status == "pending":
                if not header.get("known", True) and time.monotonic() - t0 > unknown_grace_s:
                    raise TransferError("unknown", f"transfer {transfer_id} never appeared")
                ask(at)
            elif status == "done":  # the prefill worker served fewer: the rest is recomputed
                end = min(end, at)
                next_start = min(next_start, end)
                in_flight = {s for s in in_flight if s < end}
            elif status == "blocks":
                hashes = header["hashes"]
                if not hashes or list(hashes) != expected[at - start : at - start + len(hashes)]:
                    raise TransferError("hash_mismatch", f"blocks from {at}")
                chunk = assemble(header, frames[1:])
                num_bytes += sum(v.nbytes for v in chunk[0].layers)
                chunks[at] = (hashes, chunk)
            else:
                raise TransferError(status, str(header.get("reason", ""))[:200])
        out: list[tuple[BlockHash, BlockView]] = []
        pos = start
        while pos in chunks and pos < end:
            hashes, chunk = chunks.pop(pos)
            out.extend(zip(hashes, chunk, strict=True))
            pos += len(hashes)
        return PulledBlocks(out[: end - start], num_bytes, time.monotonic() - t0)
    except (zmq.ZMQError, ValueError, KeyError, TypeError) as e:
        raise TransferError("protocol", f"{type(e).__name__}: {e}") from None
    finally:
        # done or not, the prefill worker may let the blocks go (a failed load recomputes)
        with contextlib.suppress(zmq.ZMQError):
            sock.send_multipart(release_message(transfer_id), zmq.NOBLOCK)
        sock.close()


def _receive(sock: zmq.Socket, deadline: float, cancel: Event) -> list:
    """The next reply. The server answers every pull within about a second (a "pending"
    at least), so a longer silence means it is gone: the load fails at once, not at the
    deadline."""
    silent_until = time.monotonic() + SILENCE_S
    while True:
        if cancel.is_set():
            raise TransferError("cancelled")
        now = time.monotonic()
        if now >= deadline:
            raise TransferError("timeout")
        if now >= silent_until:
            raise TransferError("unreachable", f"no reply for {SILENCE_S:g}s")
        if sock.poll(min(_POLL_MS, int((deadline - now) * 1000) + 1)):
            return sock.recv_multipart(copy=False)
