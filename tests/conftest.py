from __future__ import annotations

import contextlib
import functools
import gc
import os

import pytest
import torch

torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))


@pytest.fixture(autouse=True, scope="module")
def _collect_leaked_clients():
    """After each module, collect its garbage while no event loop runs: an async HTTP client
    a third-party library left open, finalized later inside another test's loop, would fail
    that test ("Event loop is closed" from its transport's close)."""
    yield
    gc.collect()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """$TOKENMILL_CACHE in a new folder (no KLD or row-limit measurements kept) with this
    machine's built C kernels linked in: a `serve` subprocess would otherwise compile them
    again (~10 s)."""
    from tokenmill.cache_dirs import cache_root
    from tokenmill.kernels.build import load_kernels

    load_kernels()  # built into the user's cache if they are not yet
    root = tmp_path / "cache"
    root.mkdir()
    if (cache_root() / "kernels").is_dir():
        (root / "kernels").symlink_to(cache_root() / "kernels", target_is_directory=True)
    monkeypatch.setenv("TOKENMILL_CACHE", str(root))
    return root


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from tests.tiny_models import make_hf_model, save_hf_folder

    return save_hf_folder(make_hf_model("llama"), tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def embedded_llm():
    """The embedded SmolLM2-135M, shared by the tests that need the real model."""
    from tokenmill import LLM

    return LLM(kv_cache_memory_gib=0.5)


@pytest.fixture(scope="session")
def hf_model():
    """transformers' float32 model of the embedded GGUF file: the reference logits."""
    from transformers import AutoModelForCausalLM

    from tokenmill.model.embedded import embedded_model_path

    path = embedded_model_path()
    with _memoized_gguf_reads():
        return AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        ).eval()


@contextlib.contextmanager
def _memoized_gguf_reads():
    """transformers' GGUF loading parses the file twice with gguf-py's reader (~6 s each on
    the 49,152-token vocabulary) and rebuilds gguf-py's tensor-name map once per tensor
    (~8 s in all): both are pure, so while the reference loads they are computed once. The
    weights and config are still transformers' own reading of the file."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(reader)
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
