"""The integer-dot / GEMM row limit: what it picks from timings, where it is stored and read
back, and that packed layers follow it."""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_native_weights import packed
from tokenmill.config import KernelConfig
from tokenmill.kernels import ops
from tokenmill.model import row_kernels
from tokenmill.model.linear import INT_DOT_MAX_ROWS, NativeMethod, PackedLinear


def fake_clock(monkeypatch, cost: dict[str, callable]):
    """Kernels that take cost[name](rows) seconds on a clock the measurement reads."""
    now = [0.0]
    monkeypatch.setattr(row_kernels.time, "perf_counter", lambda: now[0])

    def kernel(name):
        def run(x):
            now[0] += cost[name](x.shape[0])

        return run

    return kernel("int_dot"), kernel("gemm")


@pytest.mark.parametrize(
    ("gemm_cost", "expected"),
    [
        (lambda m: 1e-3 + 5e-6 * m, 128),  # int-dot 1e-5 a row: the GEMM wins past 200 rows
        (lambda m: 2e-5 * m, row_kernels.UNLIMITED),  # the GEMM is never faster
        (lambda m: 5e-6 * m, INT_DOT_MAX_ROWS),  # faster from the first count: the floor
    ],
)
def test_the_limit_is_the_largest_count_the_int_dot_kernel_won(monkeypatch, gemm_cost, expected):
    int_dot, gemm = fake_clock(monkeypatch, {"int_dot": lambda m: 1e-5 * m, "gemm": gemm_cost})
    limit, timings = row_kernels.measure_limit(int_dot, gemm, 64, INT_DOT_MAX_ROWS)
    assert limit == expected
    # it stops at the first count the GEMM won
    lost = [m for m, a, b in timings if a > b]
    assert lost == ([] if expected == row_kernels.UNLIMITED else [timings[-1][0]])


def test_the_best_run_counts_not_a_slow_one(monkeypatch):
    slow_once = iter([64e-5, 1.0])  # the first timed int-dot run at 64 rows: slowed by a neighbour
    cost = {
        "int_dot": lambda m: next(slow_once, 1e-5 * m) if m == 64 else 1e-5 * m,
        "gemm": lambda m: 1e-3 + 5e-6 * m,
    }
    int_dot, gemm = fake_clock(monkeypatch, cost)
    assert row_kernels.measure_limit(int_dot, gemm, 64, INT_DOT_MAX_ROWS)[0] == 128


def int_dot_layers() -> list[PackedLinear]:
    method = NativeMethod(dequant_cache_bytes=1 << 30)
    for rows in (64, 256, 32):
        method.linear(packed("Q8_0", rows, 128, seed=rows))
    return method


@pytest.fixture
def method():
    if not ops.kernels_available() or ops.int_dot_kind() == 0:
        pytest.skip("no integer-dot kernel in this build")
    return int_dot_layers()


def test_the_limit_is_measured_once_per_machine_and_stored(method, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    monkeypatch.delenv(row_kernels.ENV, raising=False)
    sample = row_kernels.choose_sample(method.packed_linears)
    assert sample.weight.rows == 256  # the largest layer within the cap
    key = row_kernels.machine_key(sample)  # as measured: float copies still there
    limit = method.choose_row_kernels()
    assert limit >= INT_DOT_MAX_ROWS
    assert all(x.int_dot_max_rows == limit for x in method.packed_linears)
    stored = row_kernels._read(row_kernels.cache_file())
    assert stored == {key: limit}

    def measure(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(row_kernels, "measure_limit", measure)
    assert int_dot_layers().choose_row_kernels() == limit  # read back, not measured
    monkeypatch.setenv(row_kernels.ENV, "80")
    assert int_dot_layers().choose_row_kernels() == 80
    for bad in ("0", "-5", "many", "1e3"):
        monkeypatch.setenv(row_kernels.ENV, bad)
        with pytest.raises(ValueError, match="TOKENMILL_INT_DOT_MAX_ROWS"):
            int_dot_layers().choose_row_kernels()


def test_a_broken_store_is_measured_again(method, tmp_path, monkeypatch):
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    monkeypatch.delenv(row_kernels.ENV, raising=False)
    row_kernels.cache_file().parent.mkdir(parents=True)
    row_kernels.cache_file().write_text("[not, json")
    monkeypatch.setattr(row_kernels, "measure_limit", lambda *a: (512, [(64, 1e-3, 2e-3)]))
    assert method.choose_row_kernels() == 512
    assert list(row_kernels._read(row_kernels.cache_file()).values()) == [512]


@pytest.mark.parametrize("bits", [8, 16, 24])
def test_packed_layers_run_the_int_dot_kernel_up_to_the_limit(method, bits):
    linear = method.packed_linears[1]
    linear.activation_bits = bits
    x = torch.randn(48, 128)
    linear.int_dot_max_rows = INT_DOT_MAX_ROWS  # 48 rows: the fp32 GEMM
    assert torch.equal(linear(x), linear.gemm_rows(x))
    assert linear.greedy_argmax(x) is None
    linear.int_dot_max_rows = 64  # now the integer-dot GEMM, row for row as in any other step
    together = linear(x)
    assert torch.equal(together, linear.int_dot_rows(x))
    assert not torch.equal(together, linear.gemm_rows(x))  # integer activations: not the GEMM
    assert torch.equal(together[40], linear(x[7:].contiguous())[33])  # 41 rows: the GEMM too
    exact = x.double() @ linear.weight.dequantize().double().t()
    scale = x.abs().double() @ linear.weight.dequantize().abs().double().t()
    assert ((together - exact).abs() <= {8: 4e-3, 16: 2e-5, 24: 2e-6}[bits] * scale).all()
    alone = linear(x[40:41])[0]  # one row: the decode GEMV, at the same bits
    assert torch.equal(together[40], alone)
    # the argmax kernel's, at the same bits: the GEMM's rows and the GEMV's
    assert torch.equal(linear.greedy_argmax(x), together.max(dim=1).indices)
    assert torch.equal(linear.greedy_argmax(x[:32]), linear(x[:32]).max(dim=1).indices)


def test_float_copies_go_where_no_step_runs_the_gemm(method):
    other = method.linear(packed("Q5_0", 32, 128))  # no integer-dot kernel for Q5_0
    assert other.int_dot is None and other.float_linear is not None
    method.kernels = KernelConfig(int_dot_max_rows=1024)
    method.choose_row_kernels()
    assert all(x.float_linear is not None for x in method.packed_linears)
    x = torch.randn(1100, 128)
    linear = method.packed_linears[1]
    expected = linear(x)  # past the limit: the GEMM on the float copy
    method.kernels = KernelConfig(int_dot_max_rows="any")
    assert method.choose_row_kernels() == row_kernels.UNLIMITED
    assert [x.float_linear is None for x in method.packed_linears] == [True] * 3 + [False]
    got = linear(x)  # now the integer-dot kernel (16-bit activations)
    assert torch.equal(got, linear.int_dot_rows(x))
    scale = x.abs() @ linear.weight.dequantize().abs().t()
    assert ((got - expected).abs() <= 2e-5 * scale).all()
    assert torch.equal(other(x), other.gemm_rows(x))


@pytest.mark.parametrize("amx_faster", [True, False])
def test_the_gemm_tiles_run_on_amx_where_timed_faster_and_the_choice_is_stored(
    method, tmp_path, monkeypatch, amx_faster
):
    """Where the build has AMX tiles, the GEMM is timed with and without them on the sample
    layer; the faster stays set, is stored, and is read back without timing again."""
    monkeypatch.setenv("TOKENMILL_CACHE", str(tmp_path))
    if not ops.int_dot_amx_available():
        assert row_kernels.amx_tiles(method.packed_linears) is None  # no tiles: nothing to set
    setting, calls = [True], []
    monkeypatch.setattr(ops, "int_dot_amx_available", lambda: True)
    monkeypatch.setattr(ops, "set_int_dot_amx", lambda on: setting.__setitem__(0, on))
    now = [0.0]
    monkeypatch.setattr(row_kernels.time, "perf_counter", lambda: now[0])
    sample = row_kernels.choose_sample(method.packed_linears)

    def gemm(x):  # 1e-5 s a row on the faster tiles, twice that on the other
        calls.append(setting[0])
        now[0] += x.shape[0] * (1e-5 if setting[0] == amx_faster else 2e-5)

    monkeypatch.setattr(sample, "int_dot_rows", gemm)
    assert row_kernels.amx_tiles(method.packed_linears) is amx_faster
    assert setting[0] is amx_faster and set(calls) == {True, False}
    stored = row_kernels._read(row_kernels.cache_file())
    assert stored[row_kernels.machine_key(sample) + "|amx_tiles"] is amx_faster
    calls.clear()
    setting[0] = not amx_faster
    assert row_kernels.amx_tiles(method.packed_linears) is amx_faster  # read back
    assert calls == [] and setting[0] is amx_faster
