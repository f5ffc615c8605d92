"""vLLM's runtime LoRA bodies: /v1/load_lora_adapter and /v1/unload_lora_adapter."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from tokenmill.lora_request import check_lora_name
from tokenmill.openai.protocol import APIModel

Name = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(check_lora_name)]


class LoadLoRAAdapterRequest(APIModel):
    lora_name: Name
    lora_path: Annotated[str, Field(min_length=1, max_length=4096)]


class UnloadLoRAAdapterRequest(APIModel):
    lora_name: Name
