"""KV transfer counters of one worker, since start (reported with the scheduler stats)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class KVTransferStats:
    # prefill side
    transfers_served: int = 0  # confirmed by the puller (its lease ended then)
    blocks_sent: int = 0
    bytes_sent: int = 0
    leases_expired: int = 0  # ended by the timeout
    transfers_dropped: int = 0  # the request was aborted, failed or preempted
    # decode side
    transfers_received: int = 0
    blocks_received: int = 0
    bytes_received: int = 0
    receive_seconds: float = 0.0  # first pull to last block, summed
    failures: dict[str, int] = field(default_factory=dict)  # by reason
    fallbacks: int = 0  # failed loads recomputed locally

    def failed(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1

    def to_dict(self) -> dict:
        out = asdict(self)
        out["failures"] = dict(self.failures)
        return out
