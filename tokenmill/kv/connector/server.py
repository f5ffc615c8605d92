"""Prefill side, worker half: a thread that answers pulls with blocks read from the KV pool.

A pull waits (long poll) until its whole chunk is ready or the transfer ended, so a decode
worker can pull while the prefill is still running, chunk by chunk, and a chunk arrives as
soon as the prefill step that completed it returns. A pull still waiting after
`_MAX_WAIT_S` is answered "pending" (the puller asks again, or gives up at its deadline).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid

import torch
import zmq

from tokenmill.kv.connector.carriers import dtype_name, read_chunk_shm, read_chunk_tcp
from tokenmill.kv.connector.producer import KVProducer, OutboundTransfer
from tokenmill.kv.connector.wire import (
    PULL,
    RELEASE,
    PullRequest,
    decode_body,
    decode_pull,
    pack_header,
)

logger = logging.getLogger(__name__)

_MAX_WAIT_S = 1.0
_MAX_WAITING = 4096  # parked pulls; more are answered "pending" at once


class KVBlockServer:
    def __init__(
        self,
        producer: KVProducer,
        kv_caches: list[torch.Tensor],
        endpoint: str,
        ctx: zmq.Context | None = None,
    ) -> None:
        self.producer = producer
        self.kv_caches = kv_caches
        self.dtype = dtype_name(kv_caches[0].dtype)
        self.block_numel = kv_caches[0].shape[2]
        self.block_bytes = sum(2 * kv.shape[2] * kv.element_size() for kv in kv_caches)
        self.ctx = ctx or zmq.Context.instance()
        self.socket = self.ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.socket.setsockopt(zmq.MAXMSGSIZE, 1 << 16)  # requests are tiny
        bind = endpoint[:-2] + ":*" if endpoint.endswith(":0") else endpoint
        self.socket.bind(bind)
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        notify_addr = f"inproc://tokenmill-kv-notify-{uuid.uuid4().hex}"
        self.notify = self.ctx.socket(zmq.PULL)
        self.notify.bind(notify_addr)
        self._notify_push = self.ctx.socket(zmq.PUSH)  # the engine thread's
        self._notify_push.setsockopt(zmq.LINGER, 0)
        self._notify_push.connect(notify_addr)
        producer.notify_server = self._wake
        self.waiting: list[tuple[bytes, PullRequest, float]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kv-block-server", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake()
        self.thread.join(timeout=5)
        for s in (self.socket, self.notify, self._notify_push):
            s.close(linger=0)

    def _wake(self) -> None:
        with contextlib.suppress(zmq.Again):
            self._notify_push.send(b"", zmq.NOBLOCK)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.notify, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(100 if self.waiting else 1000))
            if events.get(self.notify):
                while self.notify.poll(0):
                    self.notify.recv()
            while self.socket.poll(0):
                try:
                    self._handle(self.socket.recv_multipart(copy=True))
                except Exception:  # one bad message must not stop the server
                    logger.exception("kv block server: message dropped")
            self._serve_waiting()

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            return
        identity, kind, body = frames
        try:
            if kind == RELEASE:
                self.producer.release(decode_body(body)["transfer_id"])
                return
            if kind != PULL:
                raise ValueError("unknown request kind")
            pull = decode_pull(body)
        except Exception as e:
            self._reply(
                identity, {"status": "failed", "start": None, "reason": f"bad request: {e}"}
            )
            return
        if not self._answer(identity, pull):
            if len(self.waiting) >= _MAX_WAITING:
                self._reply(identity, {"status": "pending", "start": pull.start})
            else:
                self.waiting.append((identity, pull, time.monotonic() + _MAX_WAIT_S))

    def _serve_waiting(self) -> None:
        now = time.monotonic()
        still = []
        for identity, pull, deadline in self.waiting:
            if self._answer(identity, pull):
                continue
            if now >= deadline:
                self._reply(
                    identity, {"status": "pending", "start": pull.start, "known": self._known(pull)}
                )
            else:
                still.append((identity, pull, deadline))
        self.waiting = still

    def _known(self, pull: PullRequest) -> bool:
        with self.producer.lock:
            return pull.transfer_id in self.producer.active

    def _answer(self, identity: bytes, pull: PullRequest) -> bool:
        """Replies if it can now; False means the pull waits."""
        p = self.producer
        with p.lock:
            t = p.active.get(pull.transfer_id)
            if t is None:
                why = p.ended.get(pull.transfer_id)
                if why is None:
                    return False  # not registered yet (the prefill request may be on its way)
                self._reply(identity, {"status": "failed", "start": pull.start, "reason": why})
                return True
            total = len(t.hashes)
            end = min(pull.start + pull.max_blocks, total)
            if pull.start >= total or (t.finished and pull.start >= len(t.block_ids)):
                self._reply(identity, {"status": "done", "start": pull.start})
                return True
            if len(t.block_ids) < end and not t.finished:
                return False
            end = min(end, len(t.block_ids))
            frames = self._read(t, pull, end)
        self.socket.send_multipart([identity, *frames], copy=False)
        return True

    def _read(self, t: OutboundTransfer, pull: PullRequest, end: int) -> list:
        """The reply for blocks [start, end), read under the producer's lock."""
        ids = t.block_ids[pull.start : end]
        header = {
            "status": "blocks",
            "start": pull.start,
            "hashes": t.hashes[pull.start : end],
            "layers": len(self.kv_caches),
            "block_numel": self.block_numel,
            "dtype": self.dtype,
            "shm": None,
        }
        stats = self.producer.stats
        stats.blocks_sent += len(ids)
        if pull.carrier == "shm":
            name, header["checksums"] = read_chunk_shm(self.kv_caches, ids)
            t.segments.add(name)
            header["shm"] = name
            stats.bytes_sent += len(ids) * self.block_bytes
            return [pack_header(header)]
        slices, header["checksums"] = read_chunk_tcp(self.kv_caches, ids)
        stats.bytes_sent += len(ids) * self.block_bytes
        return [pack_header(header), *(s.numpy() for s in slices)]

    def _reply(self, identity: bytes, header: dict) -> None:
        self.socket.send_multipart([identity, pack_header(header)])
