"""The engine core in its own process, driven over ZMQ (PUSH/PULL, msgpack frames).

Input frames:  [b"ADD", (request id, request)...] · [b"ABORT", ids] · [b"UTIL", [call_id, method, args]]
Output frames: [b"READY", info] · [b"OUT", outputs] · [b"UTIL", [call_id, ok, result]] · [b"ERROR", text]
The loop steps while there is work and blocks on its input socket when idle. No request
is dropped silently: one that cannot be decoded or admitted is answered as failed. The
process exits when its parent (the API process) dies, so no orphan keeps the model and the
KV-event ports.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any

import zmq

from tokenmill.config import EngineConfig
from tokenmill.engine.core import EngineCore, QueueFullError
from tokenmill.engine.lora_manager import LORA_UTILITIES, lora_utility
from tokenmill.engine.serialization import decode_request, encode_outputs, pack, unpack
from tokenmill.engine.startup import StartupProfile
from tokenmill.messages import EngineCoreOutput, EngineCoreOutputs
from tokenmill.model.prefetch import WeightPrefetch

logger = logging.getLogger(__name__)

_IDLE_POLL_MS = 500  # idle wake-up, to publish fresh stats


class EngineCoreProc:
    def __init__(self, core: EngineCore, input_addr: str, output_addr: str) -> None:
        self.core = core
        self.ctx = zmq.Context()
        self.input = self.ctx.socket(zmq.PULL)
        self.input.connect(input_addr)
        self.output = self.ctx.socket(zmq.PUSH)
        self.output.connect(output_addr)
        self.rejected: list[EngineCoreOutput] = []

    def send_ready(self) -> None:
        core = self.core
        info = {
            "max_model_len": core.max_model_len,
            "num_blocks": core.num_blocks,
            "block_size": core.kv_manager.block_size,
            "vocab_size": core.vocab_size,
            "model_name": core.model_name,
            "weights": core.config.model_config.weight_format,
            "quant_plan": core.config.model_config.plan.describe(),
            "weights_kld": core.weights_kld,
            "speculative": core.speculative_info(),
            "kernels": core.kernel_info(),
            "device": core.device_info(),
            "pooling": core.pooling.to_info(),
            "lora": core.lora.list() if core.lora is not None else None,
            "pid": os.getpid(),
            "startup": core.profile.to_dict(),
            "kv_transfer": core.kv_connector.info() if core.kv_connector else None,
            "scheduler": {
                "max_num_batched_tokens": core.config.scheduler_config.max_num_batched_tokens,
                "long_prefill_token_threshold": (
                    core.config.scheduler_config.long_prefill_token_threshold
                ),
            },
        }
        self.output.send_multipart([b"READY", pack(info)])

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.input, zmq.POLLIN)
        wake = self.core.wake_socket
        if wake is not None:  # KV transfers report here (blocks arrived, leases released)
            poller.register(wake, zmq.POLLIN)
        last_stats = 0.0
        while True:
            busy = self.core.has_unfinished_requests()
            events = dict(poller.poll(0 if busy else _IDLE_POLL_MS))
            while events.get(self.input):
                if not self._handle(self.input.recv_multipart()):
                    return
                events = dict(poller.poll(0))
            if wake is not None:
                self.rejected += self.core.poll_connector()
            if self.core.has_unfinished_requests() or self.rejected:
                outs = (
                    self.core.step() if self.core.has_unfinished_requests() else EngineCoreOutputs()
                )
                outs.outputs = self.rejected + outs.outputs
                self.rejected = []
                self.output.send_multipart([b"OUT", encode_outputs(outs)])
                last_stats = time.monotonic()
            elif time.monotonic() - last_stats > _IDLE_POLL_MS / 1000:
                stats = EngineCoreOutputs(stats=self.core.stats())
                self.output.send_multipart([b"OUT", encode_outputs(stats)])
                last_stats = time.monotonic()

    def _handle(self, frames: list[bytes]) -> bool:
        kind, payload = frames[0], frames[-1]
        if kind == b"ADD":
            self._add(frames)
        elif kind == b"ABORT":
            try:
                ids = unpack(payload)
                self.core.abort_requests([i for i in ids if isinstance(i, str)])
            except Exception:  # a protocol bug must not take the engine down
                logger.exception("bad abort frame ignored")
        elif kind == b"UTIL":
            call_id, method, args = unpack(payload)
            try:
                result = self._utility(method, args)
                self.output.send_multipart([b"UTIL", pack([call_id, True, result])])
            except Exception as e:  # reported to the caller, the loop goes on
                self.output.send_multipart(
                    [b"UTIL", pack([call_id, False, f"{type(e).__name__}: {e}"])]
                )
        elif kind == b"SHUTDOWN":
            return False
        return True

    def _add(self, frames: list[bytes]) -> None:
        for i in range(1, len(frames), 2):
            request_id = frames[i].decode("utf-8", "replace")
            if i + 1 < len(frames):
                self._add_one(request_id, frames[i + 1])
            else:
                self._reject(request_id, "the request frame is missing")

    def _add_one(self, request_id: str, payload: bytes) -> None:
        try:
            req = decode_request(payload)
            if req.request_id != request_id:
                raise ValueError("request id frame does not match the request")
            self.core.add_request(req)
        except (ValueError, QueueFullError) as e:
            # The API validates first; this is the last line. Reply as a finished request.
            self._reject(request_id, str(e))
        except Exception as e:  # a protocol bug must not take the engine down
            logger.exception("request %s could not be added", request_id)
            self._reject(request_id, f"{type(e).__name__}: {e}")

    def _reject(self, request_id: str, reason: str) -> None:
        self.rejected.append(
            EngineCoreOutput(request_id, [], finish_reason="error", stop_reason=reason)
        )

    def _utility(self, method: str, args: list[Any]) -> Any:
        if method == "ping":
            return "pong"
        if method == "stats":
            s = self.core.scheduler.stats()
            return [s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage]
        if method == "check_invariants":
            self.core.check_invariants()
            return True
        if method == "reset_prefix_cache":
            return self.core.reset_prefix_cache()
        if method == "kv_stats":
            s = self.core.stats()
            return {
                "prefix_cache_queries": s.prefix_cache_queries,
                "prefix_cache_hits": s.prefix_cache_hits,
                "hits_by_medium": s.prefix_cache_hits_by_medium,
                "tiers": s.kv_tiers,
                "kv_cache_usage": s.kv_cache_usage,
                **self.core.block_accounting(),
            }
        if method in LORA_UTILITIES:
            return lora_utility(self.core.lora, method, args)
        if method == "kv_digests":
            return self.core.kv_digests(args[0], args[1] if len(args) > 1 else None)
        raise ValueError(f"unknown utility method {method!r}")


def run_engine_core(
    config: EngineConfig,
    input_addr: str,
    output_addr: str,
    log_level: str = "INFO",
    profile: StartupProfile | None = None,
    prefetch: WeightPrefetch | None = None,
) -> None:
    """Process entry point (core_entry.py calls it after the imports)."""
    logging.basicConfig(  # force: a forked core inherits its parent's configuration
        level=log_level, format="%(asctime)s %(levelname)s engine-core: %(message)s", force=True
    )
    proc = None
    try:
        core = EngineCore(config, profile=profile, prefetch=prefetch)
        proc = EngineCoreProc(core, input_addr, output_addr)
        proc.send_ready()
        try:
            proc.run()
        finally:
            core.shutdown()
    except Exception as e:
        text = traceback.format_exc()
        if isinstance(e, ValueError | FileNotFoundError):  # refused settings or files: the
            # message says why
            text = str(e)
            logger.error("engine core refused to start: %s", text)
        else:
            logger.error("engine core failed:\n%s", text)
        if proc is None:  # report start-up failures to the API process
            ctx = zmq.Context()
            sock = ctx.socket(zmq.PUSH)
            sock.connect(output_addr)
            sock.send_multipart([b"ERROR", text.encode()])
            sock.close(linger=2000)
        raise SystemExit(1) from None
