"""CUDA-graph decode steps: batch sizes, padding, and the static-buffer forward (what a graph
replays) against the eager one. On a GPU the graphs are captured and replayed; elsewhere the
same static-buffer forward runs without capture (Triton under the interpreter)."""

from __future__ import annotations

import pytest
import torch

from tests.triton.conftest import DEVICE
from tokenmill import LLM
from tokenmill.model.attention import AttentionMetadata
from tokenmill.worker.cuda_graphs import CUDAGraphRunner, StaticInputs, capture_sizes, padded_size


def test_capture_sizes_and_padding_choice():
    assert capture_sizes(256) == [1, 2, 4, *range(8, 257, 8)]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 4]
    sizes = capture_sizes(20)
    assert [padded_size(n, sizes) for n in (1, 3, 5, 9, 17, 24, 25)] == [1, 4, 8, 16, 24, 24, None]


def slots_of(kv: torch.Tensor, block_size: int) -> torch.Tensor:
    """A layer's cache [2, blocks, block_size * width] as [2, slots, width]."""
    return kv.view(2, -1, kv.shape[-1] // block_size)


def _decode_step(seq_lens: list[int], block_size: int, num_blocks: int, vocab: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in seq_lens)
    pages = torch.randperm(num_blocks, generator=g)[: width * len(seq_lens)]
    table = pages.view(len(seq_lens), width)
    positions = torch.tensor(seq_lens) - 1
    slots = table[torch.arange(len(seq_lens)), positions // block_size] * block_size
    slots += positions % block_size
    ids = torch.randint(0, vocab, (len(seq_lens),), generator=g)
    meta = AttentionMetadata(slots, len(seq_lens), table, torch.tensor(seq_lens), [])
    return ids, positions, meta


def test_padded_rows_write_no_kv_and_ask_for_no_keys():
    static = StaticInputs.allocate(8, 4, torch.device("cpu"))
    static.slot_mapping.fill_(99)
    ids, positions, meta = _decode_step([5, 20, 9], 16, 12, 100, seed=0)
    static.fill(ids, positions, meta, size=8)
    assert static.slot_mapping[3:].tolist() == [-1] * 5
    assert static.seq_lens.tolist() == [5, 20, 9, 0, 0, 0, 0, 0]
    assert static.query_start_loc.tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 3]
    assert torch.equal(static.block_table[:3, :2].long(), meta.decode_block_table)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_static_forward_equals_the_eager_forward(tiny_llama_dir, rows):
    """The rows of a padded batch get the eager step's hidden states, and the KV slots they
    write are the eager step's (padding writes none)."""
    _check_static_forward(tiny_llama_dir, rows)


@pytest.mark.parametrize("family", ["gemma3", "phi3", "qwen3_moe"])
def test_static_forward_of_the_shared_decoder(tmp_path, family):
    """The shared decoder (Gemma 3's windows and scaled embeddings, Phi-3's partial rotary,
    Qwen3-MoE's grouped experts: no host sync) replays as the Llama model does."""
    from tests.family_models import make_family_model
    from tests.tiny_models import save_hf_folder

    _check_static_forward(save_hf_folder(make_family_model(family), tmp_path / family), 3)


def _check_static_forward(path, rows: int) -> None:
    llm = LLM(str(path), device=DEVICE, attention_backend="triton",
              weights="float32", num_kv_blocks=128, max_num_seqs=8)  # fmt: skip
    core = llm.engine.core
    runner, model = core.runner, core.model
    for kv in runner.kv_caches:
        kv.normal_()
    seq_lens = [7, 40, 16, 3, 65, 30, 12, 2][:rows]
    ids, positions, meta = _decode_step(seq_lens, 16, core.num_blocks, 100, seed=rows)
    before = [kv.clone() for kv in runner.kv_caches]
    eager_meta = AttentionMetadata(
        meta.slot_mapping.to(DEVICE), rows, meta.decode_block_table.to(DEVICE),
        meta.decode_seq_lens.to(DEVICE), [],
    )  # fmt: skip
    with torch.inference_mode():
        eager = model.forward(
            ids.to(DEVICE), positions.to(DEVICE), runner.kv_caches, runner.attn, eager_meta
        ).clone()
        written = [kv.clone() for kv in runner.kv_caches]
        for kv, old in zip(runner.kv_caches, before, strict=True):
            kv.copy_(old)
        graphs = CUDAGraphRunner(
            model, runner.attn, runner.kv_caches, 8, core.max_model_len, capture=DEVICE == "cuda"
        )
        static = graphs.forward(ids, positions, meta)
    assert static.shape == eager.shape
    assert torch.allclose(static, eager, atol=1e-5, rtol=1e-5)
    block_size = runner.block_size
    for kv, ref, old in zip(runner.kv_caches, written, before, strict=True):
        assert torch.allclose(kv, ref, atol=1e-5, rtol=1e-5)  # GEMMs of 3 or 4 rows round apart
        differ = slots_of(kv, block_size).ne(slots_of(old, block_size))
        changed = differ.any(dim=2).any(dim=0).nonzero().flatten().tolist()
        assert changed == sorted(meta.slot_mapping.tolist())
