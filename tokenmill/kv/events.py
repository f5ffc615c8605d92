"""KV cache events in vLLM's format, for routers (Dynamo, llm-d, tokenmill's own).

Each engine step's events go out as one `KVEventBatch` on a ZMQ PUB socket, as the frames
[topic, sequence number (8 bytes, big-endian), msgpack payload]. The payload is the
array-like encoding vLLM uses:

    KVEventBatch     = [ts, [event, ...]]
    BlockStored      = ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
    BlockRemoved     = ["BlockRemoved", block_hashes, medium]
    AllBlocksCleared = ["AllBlocksCleared"]

Block hashes are 64-bit integers (`hashing.external_hash`). `medium` is "device", "host" or
"disk". A replay socket (ZMQ ROUTER) serves missed batches: send [b"", start_seq (8 bytes)]
from a DEALER socket and receive [b"", seq, payload] for every buffered batch from start_seq
on, then [b"", seq, b""] as the end marker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import msgpack
import zmq

from tokenmill.kv.hashing import BlockHash, external_hash

logger = logging.getLogger(__name__)

DEFAULT_TOPIC = b"kv-events"


def encode_batch(ts: float, events: list[list[Any]]) -> bytes:
    return msgpack.packb([ts, events])


def decode_batch(payload: bytes) -> tuple[float, list[list[Any]]]:
    ts, events = msgpack.unpackb(payload)
    return ts, events


class KVEventCollector:
    """Collects a step's events (the KV manager and tiers report here)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[list[Any]] = []

    def block_stored(
        self,
        medium: str,
        hashes: list[BlockHash],
        parent: BlockHash | None,
        token_ids: list[int],
        lora_id: int | None = None,
    ) -> None:
        self.pending.append(
            [
                "BlockStored",
                [external_hash(h) for h in hashes],
                external_hash(parent) if parent is not None else None,
                list(token_ids),
                self.block_size,
                lora_id,  # the adapter whose KV it is (its hash covers the adapter too)
                medium,
            ]
        )

    def block_removed(self, medium: str, hashes: list[BlockHash]) -> None:
        self.pending.append(["BlockRemoved", [external_hash(h) for h in hashes], medium])

    def all_cleared(self) -> None:
        self.pending.append(["AllBlocksCleared"])

    def tier_listener(self, medium: str, stored: list[BlockHash], removed: list[BlockHash]) -> None:
        if removed:
            self.block_removed(medium, removed)
        if stored:
            self.block_stored(medium, stored, None, [])

    def take(self) -> list[list[Any]]:
        events, self.pending = self.pending, []
        return events


class KVEventPublisher:
    """PUB socket for live batches, ROUTER socket (its own thread) for replays."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None,
        topic: bytes = DEFAULT_TOPIC,
        buffer: int = 10000,
    ):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 100000)
        self.pub.bind(endpoint)
        self.topic = topic
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.replay_thread = None
        if replay_endpoint:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.bind(replay_endpoint)
            self.replay_thread = threading.Thread(
                target=self._serve_replays, name="kv-events-replay", daemon=True
            )
            self.replay_thread.start()

    def publish(self, events: list[list[Any]]) -> int | None:
        if not events:
            return None
        payload = encode_batch(time.time(), events)
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buffer.append((seq, payload))
        self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def _serve_replays(self) -> None:
        poller = zmq.Poller()
        poller.register(self.replay, zmq.POLLIN)
        while not self.closed.is_set():
            if not poller.poll(200):
                continue
            frames = self.replay.recv_multipart()
            identity, start = frames[0], frames[-1]
            start_seq = int.from_bytes(start, "big") if len(start) == 8 else 0
            with self.lock:
                batches = [(s, p) for s, p in self.buffer if s >= start_seq]
                last = self.seq - 1
            for seq, payload in batches:
                self.replay.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
            self.replay.send_multipart([identity, b"", max(last, 0).to_bytes(8, "big"), b""])

    def close(self) -> None:
        self.closed.set()
        if self.replay_thread is not None:
            self.replay_thread.join(1)
            self.replay.close(linger=0)
        self.pub.close(linger=100)
        self.ctx.term()
