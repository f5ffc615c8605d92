"""The start-up prefetch (model/prefetch.py): whatever it prepared, and however much of it,
the model built with it is bit-identical to the one built without; it prepares what the
native method asks for, in the method's dequant-cache order; bytes it did not prepare are
computed by the model; and the kernels loaded before torch share torch's OpenMP runtime."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tests.tiny_models import make_hf_model
from tests.unit.test_model_parity import write_gguf
from tokenmill.kernels import ops
from tokenmill.model.embedded import embedded_model_path
from tokenmill.model.linear import PackedLinear, get_linear_method
from tokenmill.model.llama import LlamaForCausalLM
from tokenmill.model.prefetch import FLOAT_T, INT_DOT, WeightPrefetch
from tokenmill.quant.plan import QuantPlan
from tokenmill.quant.weights import load_for_plan

pytestmark = pytest.mark.skipif(not ops.kernels_available(), reason="needs the C kernels")

NATIVE = QuantPlan(scheme="native")


def build(model: str | None, budget: int, prefetch: WeightPrefetch | None = None):
    files = load_for_plan(model, NATIVE, prefetch)
    arch = files.arch
    return LlamaForCausalLM(
        arch, files.weights, max_positions=64, method=get_linear_method("native", budget, prefetch)
    )


def linears(model: LlamaForCausalLM) -> list[PackedLinear]:
    out = []
    for layer in model.layers:
        out += [layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj]
    return [*out, model.lm_head]


def assert_same_model(ours: LlamaForCausalLM, reference: LlamaForCausalLM) -> None:
    assert torch.equal(ours.embed_tokens, reference.embed_tokens)
    for a, b in zip(linears(ours), linears(reference), strict=True):
        assert torch.equal(a.weight.data, b.weight.data)
        assert (a.int_dot is None) == (b.int_dot is None)
        if a.int_dot is not None:
            assert torch.equal(a.int_dot, b.int_dot)
        assert (a.float_linear is None) == (b.float_linear is None)
        if a.float_linear is not None:
            assert torch.equal(a.float_linear.weight_t, b.float_linear.weight_t)


@pytest.fixture(scope="module")
def reference():
    return build(None, 2 << 30)


def test_a_finished_prefetch_serves_every_result_and_changes_nothing(reference):
    prefetch = WeightPrefetch(embedded_model_path(), 2 << 30).start()
    prefetch.join()
    model = build(None, 2 << 30, prefetch)
    assert_same_model(model, reference)
    # the embedding table, a repack and a float copy per linear layer, lm_head's two
    expected = 1 + 2 * len(linears(reference))
    assert prefetch.prepared == prefetch.used == expected


def test_a_prefetch_still_running_hands_over_what_it_has(reference):
    """The realistic case: the model is built while the thread works; the first request for
    a result stops it and the model computes the rest itself."""
    prefetch = WeightPrefetch(embedded_model_path(), 2 << 30).start()
    model = build(None, 2 << 30, prefetch)
    prefetch.join(30)
    assert_same_model(model, reference)
    assert prefetch.used <= prefetch.prepared


def test_the_dequant_cache_budget_is_spent_in_the_methods_order():
    budget = 3 * 4 * 960 * 576  # room for a few of the smaller copies, in the method's order
    prefetch = WeightPrefetch(embedded_model_path(), budget).start()
    prefetch.join()
    model = build(None, budget, prefetch)
    kept = [lin.float_linear is not None for lin in linears(model)]
    assert sum(kept) >= 1 and not all(kept)
    assert prefetch.prepared == prefetch.used  # nothing prepared that the method did not ask for
    assert_same_model(model, build(None, budget))


def test_results_for_other_bytes_are_left_to_the_caller(tmp_path, reference):
    source = make_hf_model(
        "llama", hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
    )
    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(source, path, "Q4_1")
    prefetch = WeightPrefetch(path, 2 << 30).start()  # the tiny file's weights
    prefetch.join()
    assert prefetch.prepared > 0
    weight = reference.layers[0].qkv_proj.weight  # the embedded model's
    data = weight.data.numpy()
    assert prefetch.take(INT_DOT, weight.qtype, weight.rows, weight.cols, data) is None
    assert prefetch.take(FLOAT_T, weight.qtype, weight.rows, weight.cols, data) is None
    assert prefetch.used == 0
    tiny = build(str(path), 2 << 30, WeightPrefetch(path, 2 << 30).start())
    assert_same_model(tiny, build(str(path), 2 << 30))


def test_a_file_the_prefetch_cannot_read_leaves_the_loader_to_report_it(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 16)
    prefetch = WeightPrefetch(bad, 2 << 30).start()
    prefetch.join(30)
    assert prefetch.gguf_file() is None and prefetch.prepared == 0
    with pytest.raises(ValueError):
        build(str(bad), 2 << 30, prefetch)
    data = np.zeros((4, 20), np.uint8)
    assert prefetch.take(INT_DOT, 3, 4, 32, data) is None


def test_kernels_loaded_before_torch_share_its_openmp_runtime():
    code = textwrap.dedent(
        """
        import sys
        from tokenmill.kernels.build import load_kernels
        assert load_kernels() is not None and "torch" not in sys.modules
        import torch
        from tokenmill.kernels import ops
        x = torch.randn(32, 576)
        assert torch.allclose(ops.rmsnorm(x, torch.ones(576), 1e-5),
                              torch.nn.functional.rms_norm(x, (576,), torch.ones(576), 1e-5),
                              atol=1e-5)
        paths = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
        print(len(paths), sorted(paths))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    count, paths = done.stdout.split(" ", 1)
    assert count == "1" and "torch" in paths, done.stdout
