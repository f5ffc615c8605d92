"""Sends one streamed request to an OpenAI-compatible endpoint and records its timing."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from tokenmill.bench.config import Target
from tokenmill.bench.record import RequestRecord


@dataclass(frozen=True)
class Prepared:
    """A request ready to send: chat messages or a completion prompt."""

    session_id: int
    turn: int
    scheduled_s: float
    max_tokens: int
    expected_input_tokens: int
    messages: tuple[dict[str, Any], ...] = ()
    prompt: str = ""


def request_body(target: Target, model: str | None, req: Prepared) -> dict[str, Any]:
    body: dict[str, Any] = {
        "max_tokens": req.max_tokens,
        "stream": True,
        # continuous usage stats give the token count of every chunk (tokenmill, vLLM);
        # servers that don't know the field (llama-server) ignore it.
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if model:
        body["model"] = model
    if target.endpoint == "chat":
        body["messages"] = list(req.messages)
    else:
        body["prompt"] = req.prompt
    if target.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = req.max_tokens
    return body


class _Stream:
    """Accumulates SSE chunks into token arrival times and counts."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.times: list[float] = []
        self.text_flags: list[bool] = []
        self.usage_counts: list[int | None] = []
        self.parts: list[str] = []
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None

    def add(self, t: float, data: dict[str, Any]) -> None:
        if "error" in data:
            err = data["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        usage = data.get("usage")
        if usage:
            self.usage = usage
        choices = data.get("choices") or []
        if not choices:
            return
        choice = choices[0]
        if self.endpoint == "chat":
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("reasoning_content") or ""
        else:
            text = choice.get("text") or ""
        count = usage.get("completion_tokens") if usage else None
        if text or count:
            self.times.append(t)
            self.text_flags.append(bool(text))
            self.usage_counts.append(count)
            self.parts.append(text)

    def tokens_per_chunk(self) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """(times, tokens) of chunks carrying tokens; the first has text (that is the TTFT).

        Token counts come from usage deltas when usage arrived on every chunk (continuous
        usage stats); otherwise each chunk with text counts as one token.
        """
        continuous = len(self.usage_counts) > 1 and all(c is not None for c in self.usage_counts)
        times: list[float] = []
        tokens: list[int] = []
        prev = pending = 0
        for t, has_text, count in zip(self.times, self.text_flags, self.usage_counts, strict=True):
            if continuous:
                k, prev = int(count or 0) - prev, int(count or 0)
            else:
                k = int(has_text)
            if not times:
                if has_text:  # the first token(s): TTFT; tokens without text fold into it
                    times.append(t)
                    tokens.append(max(1, k + pending))
                else:
                    pending += k
            elif k > 0:
                times.append(t)
                tokens.append(k)
        return tuple(times), tuple(tokens)


async def send(
    client: httpx.AsyncClient, target: Target, model: str | None, req: Prepared, t0: float
) -> RequestRecord:
    """Sends `req` now; never raises: failures come back as records with success False."""
    start = time.perf_counter() - t0
    stream = _Stream(target.endpoint)
    status: int | None = None
    error: str | None = None
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    try:
        async with asyncio.timeout(target.request_timeout_s):
            async with client.stream(
                "POST", target.url, json=request_body(target, model, req), headers=headers
            ) as resp:
                status = resp.status_code
                if status != 200:
                    raw = (await resp.aread()).decode(errors="replace")
                    error = f"HTTP {status}: {_message(raw)}"
                else:
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == "[DONE]":
                            break
                        stream.add(time.perf_counter() - t0, json.loads(payload))
    except TimeoutError:
        error = f"timeout after {target.request_timeout_s:g}s"
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as e:
        error = f"{type(e).__name__}: {e}"
    end = time.perf_counter() - t0
    error = error or stream.error
    times, tokens = stream.tokens_per_chunk()
    if error is None and not times:
        error = "no output tokens streamed"
    usage = stream.usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return RequestRecord(
        session_id=req.session_id,
        turn=req.turn,
        scheduled_s=req.scheduled_s,
        start_s=start,
        end_s=end,
        success=error is None,
        error=error,
        status=status,
        chunk_times=times,
        chunk_tokens=tokens,
        prompt_tokens=usage.get("prompt_tokens"),
        output_tokens=usage.get("completion_tokens"),
        cached_tokens=details.get("cached_tokens"),
        expected_input_tokens=req.expected_input_tokens,
        expected_output_tokens=req.max_tokens,
        text="".join(stream.parts),
    )


def _message(raw: str) -> str:
    try:
        err = json.loads(raw).get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))[:300]
        if err:
            return str(err)[:300]
    except (ValueError, AttributeError):
        pass
    return raw[:300]
