"""Wakes the engine core's loop from another thread (a ZMQ inproc PUSH/PULL pair).

The loop polls `socket` beside its input socket and calls `drain()` when it fires; each
thread that wakes it uses its own PUSH socket (ZMQ sockets are not thread-safe).
"""

from __future__ import annotations

import contextlib
import threading
import uuid

import zmq


class Waker:
    def __init__(self, ctx: zmq.Context) -> None:
        self.ctx = ctx
        self.address = f"inproc://tokenmill-kv-wake-{uuid.uuid4().hex}"
        self.socket = ctx.socket(zmq.PULL)
        self.socket.bind(self.address)
        self._local = threading.local()

    def wake(self) -> None:
        push = getattr(self._local, "push", None)
        if push is None:
            push = self._local.push = self.ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 0)
            push.connect(self.address)
        with contextlib.suppress(zmq.Again):  # already plenty of wake-ups queued
            push.send(b"", zmq.NOBLOCK)

    def drain(self) -> None:
        while True:
            try:
                self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def close(self) -> None:
        self.socket.close(linger=0)
