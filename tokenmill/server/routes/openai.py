"""The OpenAI API's generation endpoints and the models they serve: /v1/models,
/v1/chat/completions (serving_chat.py), /v1/completions (serving_completion.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from tokenmill.openai.protocol import ChatCompletionRequest, CompletionRequest
from tokenmill.server.body import parse_body
from tokenmill.server.lora import adapters as lora_adapters
from tokenmill.server.lora import model_entry as lora_model_entry
from tokenmill.server.serving_chat import create_chat_completion
from tokenmill.server.serving_completion import create_completion
from tokenmill.server.state import ServerState, server_state

router = APIRouter()
REQUEST_BODIES = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}


@router.get("/v1/models")
async def list_models(request: Request):
    state = server_state(request)
    data = [_model(state, name) for name in state.served_model_names]
    created = int(state.started)
    for name, adapter in lora_adapters(state.engine).items():
        data.append(lora_model_entry(name, adapter, state.model_name, created))
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id}")
async def get_model(model_id: str, request: Request):
    state = server_state(request)
    state.check_model(model_id)
    adapter = lora_adapters(state.engine).get(model_id)
    if state.lora_for(model_id) is not None and adapter is not None:
        return lora_model_entry(model_id, adapter, state.model_name, int(state.started))
    return _model(state, model_id)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state = server_state(request)
    req = await parse_body(request, ChatCompletionRequest, state.settings.max_body_bytes)
    return await create_chat_completion(state, req, request, request.state.request_id)


@router.post("/v1/completions")
async def completions(request: Request):
    state = server_state(request)
    req = await parse_body(request, CompletionRequest, state.settings.max_body_bytes)
    return await create_completion(state, req, request, request.state.request_id)


def _model(state: ServerState, name: str) -> dict[str, Any]:
    """OpenAI's model object, with the engine's facts (known once the core is ready)."""
    engine = state.engine
    return {
        "id": name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "tokenmill",
        "root": engine.model_name,
        "max_model_len": engine.max_model_len,
        **_weights_metadata(engine.engine_info),
    }


def _weights_metadata(info: dict) -> dict:
    """How the weights run and, when --max-kld measured it, their KLD from float32."""
    meta: dict = {}
    if info.get("device"):
        meta["device"] = info["device"]["type"]
    if info.get("weights"):
        meta["weights"] = info["weights"]
    if info.get("quant_plan"):
        meta["quant_plan"] = info["quant_plan"]
    report = info.get("weights_kld")
    if report:
        meta["weights_kld"] = {
            k: report[k]
            for k in ("mean_kld", "p99_kld", "same_top_pct", "rms_dp_pct", "num_tokens")
            if k in report
        }
    return meta
