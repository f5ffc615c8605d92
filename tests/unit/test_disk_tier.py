"""Disk KV tier hardening: block files bound to their block and model, sizes checked on load
and at start-up, owner-only files, no symlinks followed."""

from __future__ import annotations

import math
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

from tests.unit.test_prefix_cache import _fill_to_evict, generate, prompts_with_shared_prefix
from tokenmill import LLM
from tokenmill.kv.hashing import block_hashes
from tokenmill.kv.offload import DiskTier

SHAPE = (2, 4, 8)
PROMPT = prompts_with_shared_prefix(1, prefix_len=80)[0]  # 5 full blocks of 16 tokens


def tier(path: Path, fingerprint: str = "model-a", shape: tuple[int, ...] = SHAPE) -> DiskTier:
    return DiskTier(path, 1 << 20, shape, torch.float16, fingerprint=fingerprint)


def block(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).half()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(scope="module")
def expected(tiny_llama_dir) -> list[int]:
    """Greedy tokens of PROMPT from an engine without any offload tier."""
    ref = LLM(str(tiny_llama_dir), kv_cache_memory_gib=0.05, enable_prefix_caching=False)
    return generate(ref, [PROMPT])[0].outputs[0].token_ids


def offload_llm(model_dir: Path, path: Path) -> LLM:
    return LLM(
        str(model_dir), num_kv_blocks=12, kv_offload_disk_gib=0.05, kv_offload_path=str(path)
    )


def evicted_to_disk(model_dir: Path, path: Path) -> tuple[LLM, DiskTier, list[bytes]]:
    """An engine whose device pool no longer holds PROMPT's blocks; the disk tier does."""
    llm = offload_llm(model_dir, path)
    generate(llm, [PROMPT])
    _fill_to_evict(llm)
    disk = llm.engine.core.kv_manager.store.disk
    hashes = block_hashes(PROMPT, 16)
    assert all(disk._file(h).exists() for h in hashes)
    return llm, disk, hashes


def write_short_block(disk: DiskTier, h: bytes) -> None:
    """Block h's file rewritten by the tier itself with half a payload: header and checksum
    are valid for what it holds, only the length is wrong for this layout."""
    disk._drop(h)
    disk.put(h, torch.zeros(math.prod(disk.block_shape) // 2, dtype=disk.dtype))
    assert disk._file(h).exists()


def test_block_file_copied_over_another_is_rejected(tiny_llama_dir, tmp_path, expected):
    llm, disk, hashes = evicted_to_disk(tiny_llama_dir, tmp_path)
    shutil.copyfile(disk._file(hashes[2]), disk._file(hashes[1]))  # a valid file, wrong name
    back = generate(llm, [PROMPT])[0]
    assert disk.stats.corrupted == 1 and not disk._file(hashes[1]).exists()
    assert back.num_cached_tokens == 16  # block 0 only; block 1 and after are recomputed
    assert back.outputs[0].token_ids == expected


def test_wrong_length_block_file_is_a_miss(tiny_llama_dir, tmp_path, expected):
    llm, disk, hashes = evicted_to_disk(tiny_llama_dir, tmp_path)
    write_short_block(disk, hashes[1])
    back = generate(llm, [PROMPT])[0]
    assert disk.stats.corrupted == 1 and not disk._file(hashes[1]).exists()
    assert back.num_cached_tokens == 16
    assert back.outputs[0].token_ids == expected
    assert generate(llm, [PROMPT])[0].outputs[0].token_ids == expected  # still serving


def test_wrong_length_block_file_is_dropped_at_start_up(tiny_llama_dir, tmp_path, expected):
    _, disk, hashes = evicted_to_disk(tiny_llama_dir, tmp_path)
    write_short_block(disk, hashes[1])
    restarted = offload_llm(tiny_llama_dir, tmp_path)  # same model: adopts the same directory
    disk2 = restarted.engine.core.kv_manager.store.disk
    assert disk2.path == disk.path and hashes[0] in disk2
    assert hashes[1] not in disk2 and not disk._file(hashes[1]).exists()
    assert disk2.stats.corrupted == 1
    back = generate(restarted, [PROMPT])[0]
    assert back.num_cached_tokens == 16 and back.outputs[0].token_ids == expected


@pytest.mark.parametrize(
    "fingerprint,shape", [("model-b", SHAPE), ("model-a", (4, 2, 8))], ids=["model", "layout"]
)
def test_file_of_another_model_or_layout_is_rejected(tmp_path, fingerprint, shape):
    h = bytes(range(16))
    tier(tmp_path).put(h, block(0))
    other = tier(tmp_path, fingerprint, shape)  # same byte size, so adopted at start-up
    assert h in other
    assert other.get(h) is None and other.stats.corrupted == 1 and h not in other
    assert not other._file(h).exists()


def test_same_model_and_layout_reloads_after_restart(tmp_path):
    h = bytes(range(16))
    tier(tmp_path).put(h, block(0))
    assert torch.equal(tier(tmp_path).get(h), block(0))


def test_files_and_directory_are_owner_only(tmp_path):
    path = tmp_path / "kv"
    path.mkdir()
    path.chmod(0o755)  # as an earlier version (or a umask of 022) left it
    old = os.umask(0)  # the file mode must not depend on the umask
    try:
        disk = tier(path)
        disk.put(b"\x01" * 16, block(0))
    finally:
        os.umask(old)
    assert mode(path) == 0o700, "an existing directory we own is tightened"
    assert mode(disk._file(b"\x01" * 16)) == 0o600
    fresh = tier(tmp_path / "new" / "kv")
    assert mode(fresh.path) == 0o700


def test_symlinked_block_file_is_not_followed(tmp_path):
    disk = tier(tmp_path / "kv")
    h = bytes(range(16))
    disk.put(h, block(0))
    outside = tmp_path / "elsewhere.kv"
    disk._file(h).rename(outside)
    disk._file(h).symlink_to(outside)  # points at a perfectly valid file for h
    assert disk.get(h) is None and disk.stats.corrupted == 1
    assert outside.exists() and not disk._file(h).is_symlink()


def test_a_directory_in_place_of_a_block_file_is_a_miss_not_an_error(tmp_path):
    disk = tier(tmp_path / "kv")
    h = bytes(range(16))
    disk.put(h, block(0))
    disk._file(h).unlink()
    disk._file(h).mkdir()
    assert disk.get(h) is None and disk.stats.corrupted == 1 and h not in disk
    assert h not in tier(tmp_path / "kv")  # nor does it stop a restart
