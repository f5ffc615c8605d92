"""The engine core's KV connector: the producer and its block server on a prefill worker,
the consumer on a decode worker, and the waker that brings their news to the engine loop."""

from __future__ import annotations

import zmq

from tokenmill.config import KVTransferConfig
from tokenmill.kv.connector.base import ConnectorScheduler
from tokenmill.kv.connector.consumer import KVConsumer
from tokenmill.kv.connector.params import KVTransferParams
from tokenmill.kv.connector.producer import KVProducer
from tokenmill.kv.connector.server import KVBlockServer
from tokenmill.kv.connector.stats import KVTransferStats
from tokenmill.kv.connector.waker import Waker
from tokenmill.kv.manager import KVCacheManager
from tokenmill.messages import EngineCoreOutput
from tokenmill.request import Request, RequestStatus


class KVConnector:
    def __init__(
        self,
        config: KVTransferConfig,
        kv: KVCacheManager,
        scheduler: ConnectorScheduler,
        kv_caches: list,
    ) -> None:
        self.config = config
        self.scheduler = scheduler
        self.stats = KVTransferStats()
        self.ctx = zmq.Context()
        self.waker = Waker(self.ctx)
        self.producer: KVProducer | None = None
        self.server: KVBlockServer | None = None
        self.consumer: KVConsumer | None = None
        if config.role == "prefill":
            self.producer = KVProducer(kv, config.lease_timeout_s, self.stats, self.waker.wake)
            self.server = KVBlockServer(self.producer, kv_caches, config.endpoint, self.ctx)
            self.server.start()
            scheduler.connector = self.producer
        elif config.role == "decode":
            self.consumer = KVConsumer(config, kv, self.stats, self.waker.wake, self.ctx)

    @property
    def wake_socket(self) -> zmq.Socket:
        return self.waker.socket

    def info(self) -> dict:
        return {
            "role": self.config.role,
            "endpoint": self.server.endpoint if self.server else None,
            "load_failure_policy": self.config.load_failure_policy,
        }

    def check(self, params: KVTransferParams) -> None:
        if params.do_remote_decode and self.producer is None:
            raise ValueError("kv_transfer_params.do_remote_decode: this is not a prefill worker")
        if params.do_remote_prefill and self.consumer is None:
            raise ValueError("kv_transfer_params.do_remote_prefill: this is not a decode worker")

    def add(self, request: Request, params: KVTransferParams) -> None:
        """After the checks: a prefill request is scheduled and registered; a decode
        request waits (outside the scheduler) for its blocks."""
        if params.do_remote_prefill:
            assert self.consumer is not None
            if request.request_id in self.consumer.parked:
                raise ValueError(f"request_id: {request.request_id!r} is already in the engine")
            self.consumer.park(request, params)
            return
        assert self.producer is not None
        self.scheduler.add_request(request)
        try:
            self.producer.register(request, params)
        except ValueError:
            self.scheduler.finish_requests([request.request_id], RequestStatus.FINISHED_ABORTED)
            raise

    def abort(self, request_id: str) -> bool:
        """True if the request was parked here (and is now gone)."""
        return self.consumer is not None and self.consumer.cancel(request_id)

    def after_step(self) -> None:
        if self.producer is not None:
            self.producer.after_step()

    def poll(self) -> list[EngineCoreOutput]:
        """Ends leases; schedules the requests whose blocks arrived. Returns the requests
        failed by a load failure under the "fail" policy."""
        self.waker.drain()
        if self.producer is not None:
            self.producer.poll()
        if self.consumer is None:
            return []
        failed = []
        for result in self.consumer.poll():
            if result.error is not None and self.config.load_failure_policy == "fail":
                reason = f"KV load failed: {result.error}"
                failed.append(EngineCoreOutput(result.request.request_id, [], None, None,
                                               "error", reason))  # fmt: skip
                continue
            self.scheduler.add_request(result.request)
        return failed

    @property
    def num_parked(self) -> int:
        return self.consumer.num_parked if self.consumer else 0

    def shutdown(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.consumer is not None:
            self.consumer.shutdown()
        self.waker.close()
        self.ctx.destroy(linger=0)
