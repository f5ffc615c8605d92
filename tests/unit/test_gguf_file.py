"""tokenmill's GGUF header reader against gguf-py's GGUFReader (the reference), and its
refusals of files that are not what they say."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from tokenmill.model.embedded import embedded_model_path
from tokenmill.model.gguf_file import GGML_TYPE_SIZES, GGUFFile, GGUFFormatError


def assert_same_as_reference(path, flattened_by_reference: tuple[str, ...] = ()) -> None:
    ours = GGUFFile(path)
    ref = GGUFReader(str(path))
    ref_meta = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata.keys() == ref_meta.keys()
    for key, value in ref_meta.items():
        if key in flattened_by_reference:  # gguf-py's contents() flattens nested arrays
            assert [x for part in ours.metadata[key] for x in part] == value
            continue
        if isinstance(value, float):
            assert ours.metadata[key] == pytest.approx(value, rel=1e-7), key
        else:
            assert ours.metadata[key] == value, key
    assert len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ours.tensors, ref.tensors, strict=True):
        assert a.name == b.name
        assert a.tensor_type == b.tensor_type
        assert a.shape == tuple(int(d) for d in b.shape)
        assert a.n_elements == int(b.n_elements) and a.n_bytes == int(b.n_bytes)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name


def test_type_table_is_gguf_py_s():
    from gguf.constants import GGML_QUANT_SIZES

    assert {int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()} == GGML_TYPE_SIZES


def test_embedded_model_reads_as_gguf_py_reads_it():
    assert_same_as_reference(embedded_model_path())


def test_every_metadata_type_and_tensor_layout(tmp_path):
    path = tmp_path / "types.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 7)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 3.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ✓")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -0.25])
    w.add_array("t.strs", ["a", "", "ü"])
    w.add_array("t.nested", [[1, 2], [3]])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("vec", rng.standard_normal(16).astype(np.float32))
    q8 = np.frombuffer(rng.bytes(4 * 34 * 2), dtype=np.uint8).reshape(4, 68)
    w.add_tensor("q8", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same_as_reference(path, flattened_by_reference=("t.nested",))
    meta = GGUFFile(path).metadata
    assert meta["t.nested"] == [[1, 2], [3]] and meta["t.strs"] == ["a", "", "ü"]


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b"GGML" + b[4:], "not a GGUF file"),
        (lambda b: b[:4] + (1).to_bytes(4, "little") + b[8:], "version 1"),
        (lambda b: b[:4] + (3).to_bytes(4, "big") + b[8:], "not supported"),
        (lambda b: b[:8] + (2**40).to_bytes(8, "little") + b[16:], "implausible count"),
        (lambda b: b[:200], "truncated|past the end"),
        (lambda b: b[:20], "truncated|past the end"),
    ],
)
def test_a_file_that_is_not_what_it_says_is_a_clear_error(tmp_path, mutate, message):
    with open(embedded_model_path(), "rb") as f:
        source = f.read(4 << 20)
    path = tmp_path / "bad.gguf"
    path.write_bytes(mutate(source))
    with pytest.raises(GGUFFormatError, match=message):
        GGUFFile(path)
