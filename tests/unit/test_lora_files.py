"""Adapter files as load_lora reads them: the older adapter_model.bin equals the safetensors
file; what is not plain LoRA, or not a pair of low-rank tensors, is refused naming the field;
a pickle that asks to run code is refused."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.lora_models import ADAPTERS, make_peft_adapter
from tokenmill.model.lora import load_lora


@pytest.fixture(scope="module")
def folder(tiny_llama_dir, tmp_path_factory):
    name, rank, alpha, targets = ADAPTERS[2]
    return make_peft_adapter(tiny_llama_dir, tmp_path_factory.mktemp("a") / name, rank, alpha,
                             targets, seed=0)  # fmt: skip


def _copy(folder, tmp_path, config=None, tensors=None):
    out = tmp_path / "copy"
    shutil.copytree(folder, out)
    if config is not None:
        old = json.loads((out / "adapter_config.json").read_text())
        (out / "adapter_config.json").write_text(json.dumps({**old, **config}))
    if tensors is not None:
        save_file(tensors, str(out / "adapter_model.safetensors"))
    return out


def test_adapter_model_bin_equals_the_safetensors_file(folder, tmp_path):
    out = _copy(folder, tmp_path)
    tensors = load_file(str(out / "adapter_model.safetensors"))
    (out / "adapter_model.safetensors").unlink()
    torch.save(tensors, out / "adapter_model.bin")
    a, b = load_lora("st", str(folder)), load_lora("bin", str(out))
    assert a.deltas.keys() == b.deltas.keys()
    for key, (a_a, a_b) in a.deltas.items():
        b_a, b_b = b.deltas[key]
        assert torch.equal(a_a, b_a) and torch.equal(a_b, b_b), key


class _Boom:
    def __reduce__(self):
        return (print, ("this ran",))


def test_a_bin_that_runs_code_is_refused(folder, tmp_path, capsys):
    out = _copy(folder, tmp_path)
    (out / "adapter_model.safetensors").unlink()
    (out / "adapter_model.bin").write_bytes(pickle.dumps({"x": _Boom()}))
    with pytest.raises(ValueError, match="adapter_model.bin: not a file of tensors"):
        load_lora("evil", str(out))
    assert "this ran" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "config, field",
    [
        ({"use_dora": True}, "use_dora"),
        ({"fan_in_fan_out": True}, "fan_in_fan_out"),
        ({"bias": "all"}, "bias"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"peft_type": "IA3"}, "peft_type"),
    ],
)
def test_what_is_not_plain_lora_is_refused_by_name(folder, tmp_path, config, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        load_lora("x", str(_copy(folder, tmp_path, config=config)))


def test_bad_tensors_are_refused_naming_the_layer(folder, tmp_path):
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    key = next(k for k in tensors if k.endswith("q_proj.lora_B.weight"))
    missing = {k: v for k, v in tensors.items() if k != key}
    with pytest.raises(ValueError, match=r"layers\.\d+\.q_proj: lora_A or lora_B missing"):
        load_lora("x", str(_copy(folder, tmp_path / "1", tensors=missing)))
    wrong = {**tensors, key: tensors[key][:, :-1].contiguous()}
    with pytest.raises(ValueError, match="do not make a low-rank pair"):
        load_lora("x", str(_copy(folder, tmp_path / "2", tensors=wrong)))
    head = {**tensors, "base_model.model.lm_head.lora_A.weight": torch.zeros(4, 8)}
    with pytest.raises(ValueError, match="target_modules: .*lm_head"):
        load_lora("x", str(_copy(folder, tmp_path / "3", tensors=head)))
    (tmp_path / "4").mkdir()
    bad = _copy(folder, tmp_path / "4")
    (bad / "adapter_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="adapter_config.json: not JSON"):
        load_lora("x", str(bad))


def test_a_corrupt_weights_file_is_refused_by_name(folder, tmp_path):
    data = (folder / "adapter_model.safetensors").read_bytes()
    for i, junk in enumerate((data[: len(data) // 2], b"\xff" * 64, b"")):
        bad = _copy(folder, tmp_path / str(i))
        (bad / "adapter_model.safetensors").write_bytes(junk)
        with pytest.raises(ValueError, match="adapter_model.safetensors: not a safetensors file"):
            load_lora("x", str(bad))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_naming_the_layer(folder, tmp_path, value):
    from tokenmill.model.lora import check_lora

    tensors = load_file(str(folder / "adapter_model.safetensors"))
    key = next(k for k in tensors if k.endswith("v_proj.lora_B.weight"))
    poisoned = tensors[key].clone()
    poisoned[0, 0] = value
    adapter = load_lora("x", str(_copy(folder, tmp_path, tensors={**tensors, key: poisoned})))
    shapes = {m: (a.shape[1], b.shape[0]) for (_, m), (a, b) in adapter.deltas.items()}
    with pytest.raises(ValueError, match=r"layers\.\d+\.v_proj holds NaN or infinite weights"):
        check_lora(adapter, shapes, num_layers=64, max_rank=64)


def test_weights_beyond_float16_are_refused_under_float16(folder, tmp_path, tiny_llama_dir):
    """Over a quantized base the adapters are float16 (--lora-dtype auto): one whose weights
    float16 cannot hold is refused naming the flag, and the loaded ones keep serving."""
    from tokenmill import LLM

    tensors = load_file(str(folder / "adapter_model.safetensors"))
    key = next(k for k in tensors if k.endswith("lora_B.weight"))
    huge = _copy(folder, tmp_path, tensors={**tensors, key: tensors[key] * 1e8})
    llm = LLM(str(tiny_llama_dir), weights="q8_0", kv_cache_memory_gib=0.05, max_lora_rank=16,
              lora_modules=(f"ok={folder}",))  # fmt: skip
    manager = llm.engine.core.lora
    if not manager.model.kernel:
        pytest.skip("no C compiler: the adapters stay float32")
    with pytest.raises(ValueError, match="lora_dtype: adapter 'huge' has weights beyond"):
        manager.load("huge", str(huge))
    assert list(manager.model.adapters) == ["ok"]
    from tokenmill import SamplingParams

    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), lora_name="ok")
    assert len(out[0].outputs[0].token_ids) == 2
