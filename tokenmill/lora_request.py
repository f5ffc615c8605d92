"""A LoRA adapter named for the offline API, as vLLM's LoRARequest: `LLM.generate(...,
lora_request=LoRARequest("sql", 1, "./sql-lora"))` loads it on first use."""

from __future__ import annotations

import re
from dataclasses import dataclass

# what clients send as `model`: printable, no spaces; not only dots (never a path's part)
_NAME = re.compile(r"(?!\.+$)[^\s\x00-\x1f\x7f]{1,256}")


def check_lora_name(name: str) -> str:
    """The name, or ValueError when it cannot name an adapter."""
    if not _NAME.fullmatch(name):
        raise ValueError(
            f"lora_name: {name[:80]!r} is not an adapter name (1-256 printable characters, no "
            "spaces, not only dots)"
        )
    return name


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int  # vLLM's id; tokenmill numbers adapters itself
    lora_path: str = ""
