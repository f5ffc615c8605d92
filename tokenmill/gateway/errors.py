"""The gateway's configuration error: it names the offending key as a dotted path."""

from __future__ import annotations


class GatewayConfigError(ValueError):
    """A bad gateway config value; `path` is where it sits, e.g. `guardrails[2].action`
    ("" for the file as a whole: unreadable, too big, not YAML)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(
            f"gateway config: {path}: {message}" if path else f"gateway config: {message}"
        )
        self.path = path
        self.message = message
