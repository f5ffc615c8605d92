"""`kv_transfer_params` of a request (vLLM's field): what the router asks a worker to do."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TRANSFER_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_ENDPOINT = re.compile(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]{1,253}):(\d{1,5})")
_KEYS = frozenset({"do_remote_decode", "do_remote_prefill", "transfer_id", "remote_endpoint"})


@dataclass(frozen=True)
class KVTransferParams:
    """do_remote_decode: a prefill worker computes the prompt and serves its KV blocks under
    `transfer_id`; do_remote_prefill: a decode worker pulls them from `remote_endpoint`."""

    transfer_id: str
    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.do_remote_decode == self.do_remote_prefill:
            raise ValueError("exactly one of do_remote_decode and do_remote_prefill must be true")
        if not isinstance(self.transfer_id, str) or not _TRANSFER_ID.fullmatch(self.transfer_id):
            raise ValueError("transfer_id: 1 to 128 characters of A-Z a-z 0-9 . _ : -")
        if self.do_remote_prefill:
            m = _ENDPOINT.fullmatch(self.remote_endpoint or "")
            if m is None or not 1 <= int(m.group(2)) <= 65535:
                raise ValueError("remote_endpoint: must be tcp://HOST:PORT")
        elif self.remote_endpoint is not None:
            raise ValueError("remote_endpoint: only with do_remote_prefill")

    @classmethod
    def from_json(cls, value: Any) -> KVTransferParams:
        if not isinstance(value, dict):
            raise ValueError("must be an object")
        unknown = set(value) - _KEYS
        if unknown:
            raise ValueError(f"unknown field {sorted(unknown)[0]!r}")
        for flag in ("do_remote_decode", "do_remote_prefill"):
            if not isinstance(value.get(flag, False), bool):
                raise ValueError(f"{flag}: must be a boolean")
        endpoint = value.get("remote_endpoint")
        if endpoint is not None and not isinstance(endpoint, str):
            raise ValueError("remote_endpoint: must be a string")
        return cls(
            value.get("transfer_id"),  # type: ignore[arg-type]  # checked in __post_init__
            value.get("do_remote_decode", False),
            value.get("do_remote_prefill", False),
            endpoint,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"transfer_id": self.transfer_id}
        if self.do_remote_decode:
            out["do_remote_decode"] = True
        else:
            out["do_remote_prefill"] = True
            out["remote_endpoint"] = self.remote_endpoint
        return out
