"""Request fields this server knows but does not implement. Accepting one and ignoring it
would change the answer without a word (a lost conversation, an output constraint not
applied), so a value that asks for something is a 400 naming the field; null, false, 0, ""
and empty lists or objects ask for nothing and pass (clients send defaults). The table in
docs/api-fields.md lists every field of every endpoint and what is done with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from pydantic_core import PydanticCustomError


def asks_nothing(value: Any) -> bool:
    """null, false, 0, "", [] or an object of only such values."""
    if isinstance(value, dict):
        return all(asks_nothing(v) for v in value.values())
    return value in (None, False, 0, "", [])


def unsupported(why: str, allowed: Callable[[Any], bool] = asks_nothing) -> Any:
    """The type of a field this server does not implement: a value `allowed` accepts (by
    default, one that asks for nothing) passes; any other is a validation error (a 400 with
    `param` the field) that says why."""

    def check(value: Any) -> Any:
        if not allowed(value):
            raise PydanticCustomError(
                "unsupported", "not supported by this server: {why}", {"why": why}
            )
        return value

    return Annotated[Any, AfterValidator(check), Field(description=f"Not supported: {why}")]


def one_of(*values: Any) -> Callable[[Any], bool]:
    """Allows these values (a default that changes nothing) besides those asking nothing."""
    return lambda value: asks_nothing(value) or value in values
