"""What a request constrains its output to: JSON (any object or a schema), a regex, a Lark
grammar, or one of a list of strings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# stop_reason of a request failed because its grammar matcher broke mid-generation (it hit
# one of llguidance's resource limits, e.g. a regex repeat count in the millions).
CONSTRAINT_FAILED = "structured output could not be followed: "


class ConstraintFailedError(ValueError):
    """The request's constraint failed during generation (a client's constraint: HTTP 400)."""


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: dict[str, Any] | bool | None = None  # a JSON schema, or True for any JSON object
    regex: str | None = None
    grammar: str | None = None  # Lark (llguidance dialect; may embed %json {...})
    choice: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        given = [
            k
            for k in ("json", "regex", "grammar", "choice")
            if getattr(self, k) not in (None, False)
        ]
        if len(given) != 1:
            raise ValueError(
                f"structured_outputs: exactly one of json, regex, grammar, choice is required (got {given or 'none'})"
            )
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError(
                "structured_outputs.choice: must be a non-empty list of non-empty strings"
            )
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError("structured_outputs.json: must be a JSON schema object or true")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError("structured_outputs.regex: must be a string")
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise ValueError("structured_outputs.grammar: must be a string")

    @property
    def kind(self) -> str:
        return next(
            k
            for k in ("json", "regex", "grammar", "choice")
            if getattr(self, k) not in (None, False)
        )

    def cache_key(self) -> str:
        value = getattr(self, self.kind)
        return f"{self.kind}:{json.dumps(value, sort_keys=True) if not isinstance(value, str) else value}"

    def to_wire(self) -> list[Any]:
        return [self.json, self.regex, self.grammar, list(self.choice) if self.choice else None]

    @classmethod
    def from_wire(cls, values: list[Any]) -> StructuredOutputsParams:
        json_, regex, grammar, choice = values
        return cls(json_, regex, grammar, tuple(choice) if choice else None)
