"""vLLM's runtime LoRA routes: POST /v1/load_lora_adapter {"lora_name", "lora_path"} and
POST /v1/unload_lora_adapter {"lora_name"} (server/lora.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from tokenmill.openai.lora import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from tokenmill.server.body import parse_body
from tokenmill.server.lora import load_adapter, unload_adapter
from tokenmill.server.state import server_state

router = APIRouter()
REQUEST_BODIES = {
    "/v1/load_lora_adapter": LoadLoRAAdapterRequest,
    "/v1/unload_lora_adapter": UnloadLoRAAdapterRequest,
}


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request):
    state = server_state(request)
    req = await parse_body(request, LoadLoRAAdapterRequest, state.settings.max_body_bytes)
    info = await load_adapter(state.engine, state.served_model_names, req.lora_name, req.lora_path)
    return {"object": "lora_adapter", "id": info["name"], "parent": state.model_name, **info}


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request):
    state = server_state(request)
    req = await parse_body(request, UnloadLoRAAdapterRequest, state.settings.max_body_bytes)
    await unload_adapter(state.engine, req.lora_name)
    return {"object": "lora_adapter", "id": req.lora_name, "deleted": True}
