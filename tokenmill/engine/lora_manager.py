"""The engine's LoRA adapters (vLLM's --enable-lora / --lora-modules / --max-loras /
--max-lora-rank): loaded at start and at run time, refused by name when they do not fit the
base, unloaded only when no request uses them."""

from __future__ import annotations

import logging

from tokenmill.config import EngineConfig
from tokenmill.lora_request import check_lora_name
from tokenmill.model.lora import load_lora
from tokenmill.model.lora_layers import LoRAModel
from tokenmill.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


def parse_lora_module(spec: str) -> tuple[str, str]:
    """ "NAME=PATH" -> (name, path)."""
    name, sep, path = spec.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"lora_modules: expected NAME=PATH, got {spec!r}")
    return name.strip(), path.strip()


class LoRAManager:
    def __init__(self, model: LoRAModel, scheduler: Scheduler) -> None:
        self.model = model
        self.scheduler = scheduler
        scheduler.max_loras = model.max_loras

    @classmethod
    def from_config(cls, config: EngineConfig, model, runner, scheduler) -> LoRAManager | None:
        """None when LoRA is off (no --lora and no --enable-lora): the layers stay bare."""
        if not config.enable_lora and not config.lora_modules:
            return None
        if getattr(model, "encoder_only", False):
            raise ValueError("enable_lora: LoRA adapters need a decoder model")
        lora = LoRAModel(model, config.max_loras, config.max_lora_rank, config.lora_dtype)
        manager = cls(lora, scheduler)
        runner.lora = manager.model
        for spec in config.lora_modules:
            manager.load(*parse_lora_module(spec))
        return manager

    def load(self, name: str, path: str) -> dict:
        check_lora_name(name)
        if name in self.model.adapters:
            raise ValueError(f"lora_name: an adapter named {name!r} is already loaded")
        adapter = load_lora(name, path)
        self.model.add(adapter)
        logger.info("LoRA adapter %s loaded from %s (rank %d)", name, path, adapter.rank)
        return self.info(name)

    def unload(self, name: str) -> None:
        if name not in self.model.adapters:
            raise LookupError(f"lora_name: no adapter named {name!r} is loaded")
        users = [r for r in self.scheduler.requests.values() if r.lora_name == name]
        if users:
            raise ValueError(
                f"lora_name: adapter {name!r} is in use by {len(users)} request(s); "
                "unload it when they finish"
            )
        self.model.remove(name)
        logger.info("LoRA adapter %s unloaded", name)

    def check(self, name: str | None) -> None:
        if name is not None and name not in self.model.adapters:
            raise ValueError(f"model: no LoRA adapter named {name!r} is loaded")

    def lora_id(self, name: str) -> int:
        return self.model.adapters[name].adapter.lora_id

    def info(self, name: str) -> dict:
        adapter = self.model.adapters[name].adapter
        return {
            "name": name,
            "path": adapter.path,
            "rank": adapter.rank,
            "modules": adapter.modules,
            "lora_id": adapter.lora_id,
            "dtype": str(self.model.weight_dtype).removeprefix("torch."),
        }

    def list(self) -> list[dict]:
        return [self.info(name) for name in self.model.adapters]


LORA_UTILITIES = ("load_lora_adapter", "unload_lora_adapter", "list_lora_adapters")


def lora_utility(manager: LoRAManager | None, method: str, args: list) -> dict:
    """An engine-core utility call; {"error", "status"} instead of raising, so the API
    process can answer 400 (a bad adapter, one in use) or 404 (no such file or name)."""
    try:
        if manager is None:
            raise ValueError("lora: LoRA is off on this server (start it with --enable-lora)")
        if method == "load_lora_adapter":
            return {"adapter": manager.load(str(args[0]), str(args[1]))}
        if method == "unload_lora_adapter":
            manager.unload(str(args[0]))
            return {"unloaded": str(args[0])}
        return {"adapters": manager.list()}
    except (FileNotFoundError, LookupError) as e:
        return {"error": str(e).strip("'\""), "status": 404}
    except (ValueError, OSError) as e:
        return {"error": str(e), "status": 400}
