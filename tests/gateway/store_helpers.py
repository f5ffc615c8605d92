"""Row factories shared by the gateway store tests."""

from __future__ import annotations

from tokenmill.gateway.store.records import GuardrailEvent, ToolCallEvent, UsageRecord

DAY = 86_400.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def usage(i: int, **over) -> UsageRecord:
    values = dict(
        request_id=f"req-{i}", key_id="key-a", team="team-x", user_name="alice",
        model="tiny", endpoint="/v1/chat/completions", prompt_tokens=10 + i % 7,
        cached_tokens=i % 3, completion_tokens=5 + i % 11, cost_usd=0.001 * (1 + i % 5),
        ttft_s=0.05, latency_s=0.5, status=200, finish_reason="stop", created=T0 + i,
    )  # fmt: skip
    values.update(over)
    return UsageRecord(**values)


def guardrail(request_id: str, seq: int, **over) -> GuardrailEvent:
    values = dict(
        request_id=request_id, key_id="key-a", seq=seq, stage="input", rule="no-ssn",
        action="block", matched_text="123-45-6789", created=T0 + seq,
    )  # fmt: skip
    values.update(over)
    return GuardrailEvent(**values)


def tool_call(request_id: str, seq: int, **over) -> ToolCallEvent:
    values = dict(
        request_id=request_id, key_id="key-a", seq=seq, tool_name="shell",
        arguments='{"cmd": "ls"}', allowed=False, reason="not in allow-list", created=T0 + seq,
    )  # fmt: skip
    values.update(over)
    return ToolCallEvent(**values)
