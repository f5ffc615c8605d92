"""A simulated engine replica: the engine's own KV cache manager (block pool, prefix hits,
LRU eviction of free cached blocks, KV events) under a continuous-batching step loop whose
step times come from a cost model.

Scheduling follows the engine's scheduler: each step takes one token per decoding sequence,
then prefill chunks of admitted requests, then admits waiting requests (FCFS) while the
token budget and `max_num_seqs` allow. Unlike the engine, admission reserves blocks for the
whole request (prompt and reply), so nothing is ever preempted. A run of decode-only steps
is simulated as one event until the next sequence finishes (cut short at the next step
boundary when a request arrives)."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenmill.kv.events import KVEventCollector, encode_batch
from tokenmill.kv.hashing import BlockHash, external_hash
from tokenmill.kv.manager import KVCacheManager, cdiv
from tokenmill.router.sim.costs import CostModel


@dataclass(frozen=True)
class ReplicaConfig:
    num_blocks: int = 1024  # 16k tokens: 0.7 GiB of fp32 KV for SmolLM2-135M
    block_size: int = 16
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    costs: CostModel = field(default_factory=CostModel)

    def __post_init__(self) -> None:
        if min(self.num_blocks, self.block_size, self.max_num_seqs) < 1:
            raise ValueError("num_blocks, block_size and max_num_seqs: must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens: must be >= 1")


@dataclass(frozen=True)
class _Params:
    prompt_logprobs: int | None = None


_PARAMS = _Params()


class SimSequence:
    """A request as the KV cache manager reads it (duck-typed: the engine's `Request`,
    reduced to the attributes the manager uses)."""

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        hashes: list[BlockHash],
        reply: list[int],
        arrival: float,
        tag: Any = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.all_token_ids = prompt
        self.block_hashes = list(hashes)  # the manager extends it
        self.reply = reply
        self.arrival = arrival
        self.tag = tag  # the simulator's (the routing decision)
        self.cache_salt: str | None = None
        self.lora_name: str | None = None  # the base model
        self.lora_id: int | None = None
        self.skip_reading_prefix_cache = False  # a generation request reads the cache
        self.sampling_params = _PARAMS
        self.num_computed_tokens = 0
        self.cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.first_token_time: float | None = None
        self.finish_time: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.reply)


@dataclass
class _Run:
    """The step (or run of decode-only steps) in flight."""

    start: float
    step_s: float
    steps: int
    chunks: list[tuple[SimSequence, int]]
    decoding: bool

    @property
    def end(self) -> float:
        return self.start + self.steps * self.step_s


Publish = Callable[[int, bytes], None]  # (sequence number, KVEventBatch payload)


class SimReplica:
    def __init__(self, name: str, config: ReplicaConfig, publish: Publish) -> None:
        self.name = name
        self.config = config
        self.publish = publish
        self.kv = KVCacheManager(
            config.num_blocks,
            config.block_size,
            enable_caching=True,
            events=KVEventCollector(config.block_size),
        )
        self.events: KVEventCollector = self.kv.events  # type: ignore[assignment]
        self.waiting: deque[SimSequence] = deque()
        self.prefilling: list[SimSequence] = []
        self.decoding: list[tuple[int, int, SimSequence]] = []  # (last decode step, n, seq)
        self.decode_steps = 0  # decode steps run so far
        self.run: _Run | None = None
        self.busy_s = 0.0
        self._next_seq = 0  # KV event batch sequence number
        self._order = 0

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def add(self, seq: SimSequence) -> None:
        if cdiv(seq.total_tokens, self.config.block_size) > self.config.num_blocks:
            raise ValueError(f"{seq.request_id}: {seq.total_tokens} tokens exceed the KV cache")
        self.waiting.append(seq)

    # ------------------------------------------------------------ scheduling

    def plan(self, now: float) -> float | None:
        """Schedules the next step (or decode-only run) from `now`; its end, None if idle."""
        assert self.run is None
        cfg = self.config
        num_decode = len(self.decoding)
        budget = cfg.max_num_batched_tokens - num_decode
        chunks: list[tuple[SimSequence, int]] = []
        for seq in self.prefilling:
            if budget <= 0:
                break
            n = min(seq.num_prompt_tokens - seq.num_computed_tokens, budget)
            chunks.append((seq, n))
            budget -= n
        while budget > 0 and self.waiting and self.num_running < cfg.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq):
                break
            self.waiting.popleft()
            self.prefilling.append(seq)
            n = min(seq.num_prompt_tokens - seq.num_computed_tokens, budget)
            chunks.append((seq, n))
            budget -= n
        if not chunks and not num_decode:
            return None
        step_s = cfg.costs.step_time(sum(n for _, n in chunks), num_decode)
        # decode only: nothing changes until the next sequence finishes (or a request comes)
        steps = self.decoding[0][0] - self.decode_steps if not chunks else 1
        self.run = _Run(now, step_s, steps, chunks, num_decode > 0)
        return self.run.end

    def _admit(self, seq: SimSequence) -> bool:
        found = self.kv.get_computed_blocks(seq)
        seq.num_computed_tokens = found.num_tokens
        if not self.kv.allocate_slots(seq, seq.total_tokens - found.num_tokens, found):
            seq.num_computed_tokens = 0
            return False
        self.kv.record_lookup(seq, found)
        seq.cached_tokens = found.num_tokens
        return True

    def interrupt(self, now: float) -> float | None:
        """A request arrived during a decode-only run: it ends at the first step boundary
        after `now`. The run's new end, or None when it ends there anyway."""
        run = self.run
        if run is None or run.steps == 1:
            return None
        done = max(1, math.ceil((now - run.start) / run.step_s))
        if done >= run.steps:
            return None
        run.steps = done
        return run.end

    def finish_run(self, now: float) -> tuple[list[SimSequence], list[SimSequence]]:
        """Applies the run that ends now: (sequences with their first token, finished)."""
        run, self.run = self.run, None
        assert run is not None
        self.busy_s += run.steps * run.step_s
        first: list[SimSequence] = []
        done: list[SimSequence] = []
        if run.decoding:
            self.decode_steps += run.steps
            while self.decoding and self.decoding[0][0] <= self.decode_steps:
                done.append(self._finish(heapq.heappop(self.decoding)[2], now))
        for seq, n in run.chunks:
            seq.num_computed_tokens += n
            self.kv.cache_full_blocks(seq)
            if seq.num_computed_tokens < seq.num_prompt_tokens:
                continue
            self.prefilling.remove(seq)
            seq.first_token_time = now
            first.append(seq)
            if len(seq.reply) <= 1:
                done.append(self._finish(seq, now))
            else:
                self._order += 1
                last = self.decode_steps + len(seq.reply) - 1
                heapq.heappush(self.decoding, (last, self._order, seq))
        events = self.events.take()
        if events:
            self.publish(self._next_seq, encode_batch(now, events))
            self._next_seq += 1
        return first, done

    def _finish(self, seq: SimSequence, now: float) -> SimSequence:
        """Its reply's full blocks join the cache (the last token's KV is never computed)."""
        seq.all_token_ids = seq.prompt_token_ids + seq.reply
        seq.num_computed_tokens = seq.num_tokens - 1
        self.kv.cache_full_blocks(seq)
        self.kv.free(seq)
        seq.finish_time = now
        return seq

    # ------------------------------------------------------------ inspection

    def cached_hashes(self) -> set[int]:
        """The 64-bit event hashes of every block in its prefix cache."""
        return {external_hash(h) for h in self.kv.pool.cached}
