"""LoRA adapters in cache-aware routing: the engine keys a prompt's blocks by adapter and
says which in its KV events (lora_id); the router, knowing the replicas' adapters from
their /server_info, hashes a request whose `model` names one the same way, so an adapter's
traffic goes where its prefixes are and never to another adapter's blocks."""

from __future__ import annotations

from tests.lora_models import ADAPTERS, make_peft_adapter
from tokenmill import LLM, SamplingParams
from tokenmill.router.index import DEVICE, KVIndex
from tokenmill.router.prompts import PromptHasher

PROMPT = "The same long prompt for two adapters, long enough to fill a few blocks " * 3


class _Capture:
    def __init__(self) -> None:
        self.events: list = []

    def publish(self, events) -> None:
        self.events.extend(events)

    def close(self) -> None:
        pass


def test_events_and_router_hashes_carry_the_adapter(tiny_llama_dir, tmp_path):
    name, rank, alpha, targets = ADAPTERS[0]
    folder = make_peft_adapter(tiny_llama_dir, tmp_path / name, rank, alpha, targets, seed=0)
    llm = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, lora_modules=(f"{name}={folder}",))
    core = llm.engine.core
    core.publisher = _Capture()
    hasher = PromptHasher(llm.get_tokenizer(), None)
    body = {"model": name, "prompt": PROMPT, "max_tokens": 1}
    adapter_key = hasher.key("completions", body, adapters={name})
    base_key = hasher.key("completions", {**body, "model": "base"}, adapters={name})
    assert adapter_key.lora_name == name and base_key.lora_name is None
    bs = core.kv_manager.block_size
    assert set(adapter_key.hashes(bs)).isdisjoint(base_key.hashes(bs))

    params = SamplingParams(max_tokens=1, temperature=0.0)
    llm.generate([list(adapter_key.token_ids)], params, lora_name=name)
    stored = [e for e in core.publisher.events if e[0] == "BlockStored"]
    assert stored and all(e[5] == core.lora.lora_id(name) for e in stored)
    index = KVIndex()
    index.enable("replica-a")
    index.apply("replica-a", stored)
    # the router finds the adapter's prefix on the replica, and none of it for the base
    assert index.tiers("replica-a", list(adapter_key.hashes(bs)))[:2] == [DEVICE, DEVICE]
    assert index.tiers("replica-a", list(base_key.hashes(bs))) == []


def test_adapters_are_learned_from_server_info():
    from types import SimpleNamespace

    from tokenmill.router.prompts import served_adapters

    replicas = [
        SimpleNamespace(info={"engine": {}, "lora_adapters": ["sql", "poet"]}),
        SimpleNamespace(info={"lora_adapters": ["chat", 5]}),
        SimpleNamespace(info={}),
    ]
    assert served_adapters(replicas) == {"sql", "poet", "chat"}
