"""Replicas as the router sees them: address, event endpoints, health and engine facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from urllib.parse import urlsplit


def bound_to(endpoint: str, host: str) -> str:
    """A ZMQ endpoint as a peer reaches it: a wildcard bind address (how a replica binds)
    means the replica's own host."""
    for wildcard in ("://*:", "://0.0.0.0:", "://[::]:"):
        endpoint = endpoint.replace(wildcard, f"://{host}:")
    return endpoint


@dataclass(frozen=True)
class ReplicaSpec:
    """`URL[,EVENTS[,REPLAY]]`, e.g. `http://10.0.0.5:8001,tcp://*:5557,tcp://*:5558`.

    A `*` host in an event endpoint (how a replica binds) means the URL's host.
    """

    url: str
    events: str | None = None
    replay: str | None = None

    @classmethod
    def parse(cls, text: str) -> ReplicaSpec:
        parts = [p.strip() for p in text.split(",")]
        if not parts[0] or len(parts) > 3:
            raise ValueError(f"replica: {text!r} is not URL[,EVENTS[,REPLAY]]")
        url = parts[0].rstrip("/")
        if "://" not in url:
            url = "http://" + url
        host = urlsplit(url).hostname or "127.0.0.1"

        def endpoint(i: int) -> str | None:
            if len(parts) <= i or not parts[i]:
                return None
            return bound_to(parts[i], host)

        return cls(url, endpoint(1), endpoint(2))

    @cached_property
    def name(self) -> str:  # parsed once: the router reads it per candidate per decision
        u = urlsplit(self.url)
        return f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"


@dataclass
class Replica:
    spec: ReplicaSpec
    healthy: bool = False
    failures: int = 0  # failed health checks in a row
    block_size: int = 16
    pid: int | None = None
    info: dict = field(default_factory=dict)
    last_error: str | None = None
    ever_healthy: bool = False
    draining: bool = False  # leaving: no new requests
    role: str = "both"  # prefill / decode / both (its /server_info says)
    kv_endpoint: str | None = None  # a prefill worker's KV block server
    # its long_prefill_token_threshold: > 0, its steps are shared between the prompts it
    # computes, so a short prompt does not wait for a long one's whole prefill
    prompt_share_tokens: int = 0
    kv_transfer_stats: dict = field(default_factory=dict)  # its counters, last seen

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def url(self) -> str:
        return self.spec.url

    def learn_kv_transfer(self, info: dict) -> None:
        """Role and KV endpoint from /server_info; a wildcard bind address means its host."""
        engine = info.get("engine") if isinstance(info.get("engine"), dict) else {}
        kv = engine.get("kv_transfer") if isinstance(engine.get("kv_transfer"), dict) else {}
        role = kv.get("role")
        self.role = role if role in ("prefill", "decode") else "both"
        endpoint = kv.get("endpoint")
        if isinstance(endpoint, str) and endpoint.startswith("tcp://") and len(endpoint) < 300:
            self.kv_endpoint = bound_to(endpoint, urlsplit(self.url).hostname or "127.0.0.1")
        else:
            self.kv_endpoint = None
        sched = engine.get("scheduler") if isinstance(engine.get("scheduler"), dict) else {}
        share = sched.get("long_prefill_token_threshold")
        self.prompt_share_tokens = share if type(share) is int and 0 < share < 1 << 30 else 0
        stats = info.get("kv_transfer_stats")
        self.kv_transfer_stats = stats if isinstance(stats, dict) else {}
