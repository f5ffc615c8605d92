"""/v1/embeddings through the gateway: input strings scanned by the input guardrails (token
ids cannot be), usage (prompt tokens) into the ledger and the key's limits. An embedding
has no text to filter on the way out, and no text to put in its place: a rule whose action
is a fallback answer blocks it instead (Exchange: blocks_on_fallback)."""

from __future__ import annotations

from typing import Any

from tokenmill.gateway.endpoints.common import ExchangeContext, TextRef
from tokenmill.openai.completion_objects import USAGE, usage_tokens


class EmbeddingsAdapter:
    endpoint = "embeddings"
    blocks_on_fallback = True

    def input_texts(self, body: dict[str, Any]) -> list[TextRef] | None:
        value = body.get("input")
        if isinstance(value, str):
            return [TextRef(body, "input")]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [TextRef(value, i) for i in range(len(value))]
        return None if value is not None else []  # token ids: nothing to scan

    def wants_logprobs(self, body: dict[str, Any]) -> bool:
        return False

    def prepare_stream(self, body: dict[str, Any], ctx: ExchangeContext) -> None:
        pass  # embeddings are never streamed

    def tokens(self, usage: dict[str, Any] | None) -> tuple[int, int, int]:
        return usage_tokens(usage)

    async def transform_json(self, obj: dict[str, Any], ctx: ExchangeContext) -> dict[str, Any]:
        usage = obj.get(USAGE)
        ctx.usage = usage if isinstance(usage, dict) else None
        ctx.finish_reason = "stop"
        ctx.output_started()
        return obj

    def stream_rewriter(self, body: dict[str, Any], ctx: ExchangeContext):
        raise RuntimeError("the app streamed an embeddings response")
