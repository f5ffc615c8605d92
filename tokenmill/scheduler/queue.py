"""Waiting queues: first-come-first-served, or by (priority, arrival)."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from tokenmill.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._items: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._items.append(request)

    def prepend(self, request: Request) -> None:
        """Preempted requests go back to the front."""
        self._items.appendleft(request)

    def peek(self) -> Request:
        return self._items[0]

    def pop(self) -> Request:
        return self._items.popleft()

    def remove(self, request: Request) -> None:
        self._items.remove(request)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)


class PriorityQueue:
    """Lower `priority` value first, then earlier arrival."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(
            self._heap, (request.priority, request.arrival_time, next(self._counter), request)
        )

    prepend = add  # a preempted request keeps its place by (priority, arrival)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        self._heap = [item for item in self._heap if item[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (item[3] for item in sorted(self._heap))


def make_queue(policy: str) -> FCFSQueue | PriorityQueue:
    return PriorityQueue() if policy == "priority" else FCFSQueue()
