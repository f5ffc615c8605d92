"""An inner app that answers like tokenmill's server (chat, completions, Responses; JSON and
SSE with its usage options), with the output scripted by the request (`x_script`), so the
gateway's rewriting is tested against exact, known text and tool calls."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

DEFAULT_SCRIPT = {"pieces": ["Hello", " there", "."], "tool_calls": []}


def prompt_tokens(body: dict[str, Any]) -> int:
    source = body.get("messages") or body.get("prompt") or body.get("input") or ""
    return max(1, len(json.dumps(source)) // 4)


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


class Seen:
    """What the fake received (the bodies after the gateway's rewriting)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.cancelled = 0
        self.in_flight = 0


def build_fake_upstream(seen: Seen | None = None) -> FastAPI:
    app = FastAPI()
    seen = seen or Seen()
    app.state.seen = seen

    def script_of(body: dict[str, Any]) -> dict[str, Any]:
        return {**DEFAULT_SCRIPT, **(body.get("x_script") or {})}

    def usage(body, completion: int) -> dict[str, Any]:
        p = prompt_tokens(body)
        cached = min(p, int((body.get("x_script") or {}).get("cached", 0)))
        return {"prompt_tokens": p, "completion_tokens": completion, "total_tokens": p + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip

    def completion_tokens(script) -> int:
        return len(script["pieces"]) + 3 * len(script["tool_calls"])

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.bodies.append(body)
        script = script_of(body)
        if script.get("status"):
            return JSONResponse({"error": {"message": "scripted failure", "type": "invalid_request_error",
                                           "param": None, "code": "scripted"}}, status_code=script["status"])  # fmt: skip
        n = body.get("n") or 1
        rid = "chatcmpl-" + uuid.uuid4().hex
        if body.get("logprobs") and body.get("max_tokens") == 1:  # a judge's question
            question = body["messages"][-1]["content"]
            yes = 0.9 if "cats" in question.split("\n\n", 1)[-1] else 0.1
            top = [{"token": " Yes", "logprob": math.log(yes * 0.7)}, {"token": "yes", "logprob": math.log(yes * 0.3)},
                   {"token": " No", "logprob": math.log(1 - yes)}]  # fmt: skip
            return {"id": rid, "object": "chat.completion", "created": 1, "model": body.get("model"),
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": top[0]["token"]},
                                 "logprobs": {"content": [{**top[0], "bytes": None, "top_logprobs": top}]},
                                 "finish_reason": "length"}],
                    "usage": usage(body, 1)}  # fmt: skip
        if not body.get("stream"):
            calls = [{"id": f"call_{i}", "type": "function", "function": dict(c)} for i, c in enumerate(script["tool_calls"])]  # fmt: skip
            choices = [{"index": i, "message": {"role": "assistant", "content": "".join(script["pieces"]) or None,
                        "refusal": None, "tool_calls": calls}, "logprobs": None,
                        "finish_reason": "tool_calls" if calls else "stop"} for i in range(n)]  # fmt: skip
            return {"id": rid, "object": "chat.completion", "created": 1, "model": body.get("model"),
                    "choices": choices, "usage": usage(body, n * completion_tokens(script))}  # fmt: skip
        options = body.get("stream_options") or {}
        include, continuous = options.get("include_usage"), options.get("continuous_usage_stats")

        async def events():
            seen.in_flight += 1
            produced = 0
            try:

                def chunk(choices, u=None):
                    obj = {"id": rid, "object": "chat.completion.chunk", "created": 1,
                           "model": body.get("model"), "choices": choices}  # fmt: skip
                    if include:
                        obj["usage"] = (
                            u if u is not None else (usage(body, produced) if continuous else None)
                        )
                    return sse(obj)

                for i in range(n):
                    yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}])  # fmt: skip
                for piece in script["pieces"]:
                    await asyncio.sleep(script.get("delay", 0))
                    for i in range(n):
                        produced += 1
                        yield chunk([{"index": i, "delta": {"content": piece}, "logprobs": None, "finish_reason": None}])  # fmt: skip
                for i in range(n):
                    for k, call in enumerate(script["tool_calls"]):
                        produced += 3
                        args = call["arguments"]
                        yield chunk([{"index": i, "delta": {"tool_calls": [{"index": k, "id": f"call_{k}", "type": "function",
                                      "function": {"name": call["name"], "arguments": ""}}]}, "logprobs": None, "finish_reason": None}])  # fmt: skip
                        half = len(args) // 2
                        for part in (args[:half], args[half:]):
                            yield chunk([{"index": i, "delta": {"tool_calls": [{"index": k, "function": {"arguments": part}}]},
                                          "logprobs": None, "finish_reason": None}])  # fmt: skip
                    finish = "tool_calls" if script["tool_calls"] else "stop"
                    yield chunk(
                        [{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}]
                    )
                if include:
                    yield chunk([], usage(body, produced))
                yield sse("[DONE]")
            except asyncio.CancelledError:
                seen.cancelled += 1
                raise
            finally:
                seen.in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        seen.bodies.append(body)
        script = script_of(body)
        rid = "cmpl-" + uuid.uuid4().hex
        if not body.get("stream"):
            return {"id": rid, "object": "text_completion", "created": 1, "model": body.get("model"),
                    "choices": [{"index": 0, "text": "".join(script["pieces"]), "logprobs": None, "finish_reason": "stop"}],
                    "usage": usage(body, len(script["pieces"]))}  # fmt: skip
        options = body.get("stream_options") or {}

        async def events():
            produced = 0
            for piece in script["pieces"]:
                produced += 1
                obj = {"id": rid, "object": "text_completion", "created": 1, "model": body.get("model"),
                       "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]}  # fmt: skip
                if options.get("include_usage"):
                    obj["usage"] = (
                        usage(body, produced) if options.get("continuous_usage_stats") else None
                    )
                yield sse(obj)
            obj = {"id": rid, "object": "text_completion", "created": 1, "model": body.get("model"),
                   "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]}  # fmt: skip
            if options.get("include_usage"):
                obj["usage"] = (
                    usage(body, produced) if options.get("continuous_usage_stats") else None
                )
            yield sse(obj)
            if options.get("include_usage"):
                yield sse({"id": rid, "object": "text_completion", "created": 1, "model": body.get("model"),
                           "choices": [], "usage": usage(body, produced)})  # fmt: skip
            yield sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": "m", "object": "model", "created": 1, "owned_by": "t"}],
        }

    @app.get("/health")
    async def health():
        return {}

    return app
