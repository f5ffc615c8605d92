"""The gateway: API keys, limits and budgets, the usage ledger, guardrails and tool-call
policy, in front of the server and the router alike (one ASGI middleware; off unless
`--gateway-config` is given)."""
