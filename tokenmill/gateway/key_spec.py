"""What a key may be given (admin API and `tokenmill keys`): one validated shape."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Name = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Limit = Annotated[int, Field(ge=1, le=10**12)]


class KeySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name | None = None
    team: Name | None = None
    user: Name | None = None
    models: Annotated[list[Name], Field(max_length=1000)] | None = None  # None: every model
    rpm: Limit | None = None
    tpm: Limit | None = None
    max_parallel: Limit | None = None
    budget_usd: Annotated[float, Field(ge=0, le=1e9)] | None = None
    budget_period: Literal["day", "month", "total"] | None = None
    tool_policy: Name | None = None
    metadata: (
        Annotated[
            dict[Name, Annotated[str, StringConstraints(max_length=2000)]], Field(max_length=64)
        ]
        | None
    ) = None
    expires_at: Annotated[float, Field(ge=0, le=1e11)] | None = None


def stored_fields(spec: KeySpec, only_set: bool) -> dict[str, Any]:
    """The spec as key-table columns (only the fields given, for an update)."""
    values = spec.model_dump(exclude_unset=only_set)
    if "user" in values:
        values["user_name"] = values.pop("user")
    if "models" in values and values["models"] is not None:
        values["models"] = tuple(values["models"])
    if "metadata" in values and values["metadata"] is None:
        values["metadata"] = {}
    return values
