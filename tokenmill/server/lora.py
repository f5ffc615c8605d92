"""LoRA adapters in the API process: the names a request's `model` may give (the base's
served names, or an adapter's), /v1/models entries with their `parent`, and vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter."""

from __future__ import annotations

from typing import Any

from tokenmill.engine.async_llm import AsyncLLM
from tokenmill.server.errors import APIError, bad_request


def adapters(engine: AsyncLLM) -> dict[str, dict]:
    """The loaded adapters by name (the engine core's list, kept by the API process)."""
    known = getattr(engine, "lora_adapters", None)
    if known is None:
        known = engine.lora_adapters = {a["name"]: a for a in engine.engine_info.get("lora") or []}
    return known


def check_lora_names(lora_modules: tuple[str, ...], served: list[str]) -> None:
    """At start: an adapter may not take a name the base is served under."""
    for spec in lora_modules:
        name = spec.partition("=")[0].strip()
        if name in served:
            raise ValueError(
                f"--lora {spec}: the name {name!r} is the base model's served name; "
                "give the adapter another"
            )


def model_entry(name: str, adapter: dict, parent: str, created: int) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "tokenmill",
        "root": adapter["path"],
        "parent": parent,
        "lora": {"rank": adapter["rank"], "modules": adapter["modules"], "dtype": adapter["dtype"]},
    }


async def load_adapter(engine: AsyncLLM, served: list[str], name: str, path: str) -> dict:
    if name in served:
        raise bad_request(
            f"lora_name: {name!r} is the base model's served name; give the adapter another",
            "lora_name",
        )
    result = await engine.call_utility("load_lora_adapter", name, path)
    info = _answer(result, "lora_path")["adapter"]
    adapters(engine)[name] = info
    return info


async def unload_adapter(engine: AsyncLLM, name: str) -> None:
    _answer(await engine.call_utility("unload_lora_adapter", name), "lora_name")
    adapters(engine).pop(name, None)


def _answer(result: dict, param: str) -> dict:
    if "error" not in result:
        return result
    status = int(result.get("status", 400))
    field, sep, _ = result["error"].partition(": ")
    param = (
        field
        if sep and field in ("lora_name", "lora_path", "max_lora_rank", "base_model")
        else param
    )
    code = "model_not_found" if status == 404 else None
    raise APIError(status, result["error"], "invalid_request_error", param, code)
