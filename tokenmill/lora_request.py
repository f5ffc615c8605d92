"""A LoRA adapter named for the offline API, as vLLM's LoRARequest: `LLM.generate(...,
lora_request=LoRARequest("sql", 1, "./sql-lora"))` loads it on first use."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int  # vLLM's id; tokenmill numbers adapters itself
    lora_path: str = ""
