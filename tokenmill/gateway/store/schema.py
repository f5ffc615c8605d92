"""The store's tables, as DDL templates (`{real}`, `{autoinc_pk}` filled per backend)."""

from __future__ import annotations

API_KEYS = """
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    key_hash TEXT UNIQUE NOT NULL,
    name TEXT,
    team TEXT,
    user_name TEXT,
    models TEXT,            -- JSON list of model names; NULL = every model
    rpm INTEGER,
    tpm INTEGER,
    max_parallel INTEGER,
    budget_usd {real},
    budget_period TEXT,     -- 'day' | 'month' | 'total'
    tool_policy TEXT,
    metadata TEXT,          -- JSON object
    created {real} NOT NULL,
    updated {real} NOT NULL,
    expires_at {real},
    revoked_at {real}
)"""

USAGE = """
CREATE TABLE usage (
    request_id TEXT PRIMARY KEY,
    key_id TEXT,
    team TEXT,
    user_name TEXT,
    model TEXT,
    endpoint TEXT,
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER,
    cost_usd {real},
    ttft_s {real},
    latency_s {real},
    status INTEGER,
    finish_reason TEXT,
    created {real}
)"""

GUARDRAIL_EVENTS = """
CREATE TABLE guardrail_events (
    id {autoinc_pk},
    request_id TEXT NOT NULL,
    key_id TEXT,
    seq INTEGER NOT NULL,   -- the event's index within its request
    stage TEXT NOT NULL,    -- 'input' | 'output'
    rule TEXT NOT NULL,
    action TEXT,
    matched_text TEXT,
    created {real},
    UNIQUE (request_id, stage, rule, seq)
)"""

TOOL_CALL_EVENTS = """
CREATE TABLE tool_call_events (
    id {autoinc_pk},
    request_id TEXT NOT NULL,
    key_id TEXT,
    seq INTEGER NOT NULL,   -- the call's index within its request
    tool_name TEXT,
    arguments TEXT,
    allowed INTEGER,
    reason TEXT,
    created {real},
    UNIQUE (request_id, seq)
)"""

V1 = (
    API_KEYS,
    USAGE,
    GUARDRAIL_EVENTS,
    TOOL_CALL_EVENTS,
    "CREATE INDEX usage_key_created ON usage (key_id, created)",
    "CREATE INDEX usage_team_created ON usage (team, created)",
)

# v2: time-range scans without a key (rollups over everyone, reviewers' event lists)
V2 = (
    "CREATE INDEX usage_created ON usage (created)",
    "CREATE INDEX guardrail_events_key_created ON guardrail_events (key_id, created)",
    "CREATE INDEX tool_call_events_key_created ON tool_call_events (key_id, created)",
    "CREATE INDEX api_keys_updated ON api_keys (updated)",
)

# v3: guardrail events store `label: masked match` (decision.masked); rows written before
# held the matched text itself (an email a rule redacted), which is erased
V3 = ("UPDATE guardrail_events SET matched_text = NULL",)
