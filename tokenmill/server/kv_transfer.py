"""`kv_transfer_params` on a request (the router's, for prefill/decode disaggregation):
checked against this worker's role before the request reaches the engine."""

from __future__ import annotations

from typing import Any

from tokenmill.kv.connector.params import KVTransferParams
from tokenmill.server.errors import bad_request

_PARAM = "kv_transfer_params"


def kv_transfer_request(req: Any, engine_info: dict, num_prompts: int) -> dict | None:
    """The request's params in wire form, or None; a 400 for anything this worker can't do."""
    raw = getattr(req, _PARAM, None)
    if raw is None:
        return None
    try:
        params = KVTransferParams.from_json(raw)
    except ValueError as e:
        raise bad_request(f"{_PARAM}: {e}", param=_PARAM) from None
    role = (engine_info.get("kv_transfer") or {}).get("role", "both")
    wanted = "prefill" if params.do_remote_decode else "decode"
    if role != wanted:
        raise bad_request(f"{_PARAM}: this worker's role is {role}, not {wanted}", param=_PARAM)
    if getattr(req, "n", 1) != 1 or num_prompts != 1:
        raise bad_request(f"{_PARAM}: needs one prompt and n = 1", param=_PARAM)
    return params.to_json()
