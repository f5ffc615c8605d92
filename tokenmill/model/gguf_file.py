"""A GGUF file's metadata and tensor directory, read in one pass over the header; tensor
data stays in the file's read-only memory map until a loader takes it.

gguf-py's GGUFReader builds a numpy memmap view for every part of every metadata field:
on SmolLM2's 49,152-token vocabulary (plus as many merges) that is 6-20 s at start-up,
for data this reads in ~0.1 s. gguf-py stays the reference for the type tables and the
dequantizers (tests compare the two readers field by field)."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# metadata value types (GGUF spec)
_SCALARS = {
    0: ("<B", np.uint8),
    1: ("<b", np.int8),
    2: ("<H", np.uint16),
    3: ("<h", np.int16),
    4: ("<I", np.uint32),
    5: ("<i", np.int32),
    6: ("<f", np.float32),
    7: ("<?", np.bool_),
    10: ("<Q", np.uint64),
    11: ("<q", np.int64),
    12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9
# bounds for a file that is not what it says: a header never holds more than this
_MAX_COUNT = 1 << 28
_MAX_DIMS = 8


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's directory entry; `shape` in GGUF order (ne[0], the row length, first)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray  # the element type for F32/F16/..., else uint8 [rows, bytes per row]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_bytes(self) -> int:
        return int(self.data.nbytes)


class GGUFFile:
    """`metadata`: key -> value (str, int, float, bool, or a list of them); `tensors` in
    file order."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._buf = memoryview(self._map)
        self._pos = 0
        try:
            self.metadata, directory = self._read_header()
            self.tensors = self._tensors(directory)
        except (struct.error, IndexError, UnicodeDecodeError) as e:
            raise GGUFFormatError(f"{self.path}: truncated or corrupt GGUF header ({e})") from e

    # ------------------------------------------------------------ header

    def _unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _count(self) -> int:
        n = self._unpack("<Q")
        if n > _MAX_COUNT:
            raise GGUFFormatError(f"{self.path}: implausible count {n} in the header")
        return n

    def _string(self) -> str:
        n = self._count()
        start = self._pos
        self._pos += n
        if self._pos > len(self._buf):
            raise GGUFFormatError(f"{self.path}: a string runs past the end of the file")
        return str(self._buf[start : self._pos], "utf-8", "replace")

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self._unpack(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            item_type = self._unpack("<I")
            n = self._count()
            if item_type in _SCALARS:  # numbers in one slice
                dtype = np.dtype(_SCALARS[item_type][1]).newbyteorder("<")
                end = self._pos + n * dtype.itemsize
                if end > len(self._buf):
                    raise GGUFFormatError(f"{self.path}: an array runs past the end of the file")
                values = np.frombuffer(self._buf[self._pos : end], dtype=dtype).tolist()
                self._pos = end
                return values
            return [self._value(item_type) for _ in range(n)]
        raise GGUFFormatError(f"{self.path}: unknown metadata value type {vtype}")

    def _read_header(self) -> tuple[dict[str, Any], list[tuple[str, int, tuple[int, ...], int]]]:
        if bytes(self._buf[:4]) != GGUF_MAGIC:
            raise GGUFFormatError(f"{self.path}: not a GGUF file (bad magic)")
        self._pos = 4
        version = self._unpack("<I")
        if version not in (2, 3):
            raise GGUFFormatError(
                f"{self.path}: GGUF version {version} is not supported (2 and 3 are; "
                "big-endian files are not)"
            )
        n_tensors, n_kv = self._count(), self._count()
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            metadata[key] = self._value(self._unpack("<I"))
        directory = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            if n_dims > _MAX_DIMS:
                raise GGUFFormatError(f"{self.path}: tensor {name} has {n_dims} dimensions")
            dims = tuple(self._unpack("<Q") for _ in range(n_dims))
            directory.append((name, self._unpack("<I"), dims, self._unpack("<Q")))
        return metadata, directory

    def _tensors(self, directory) -> list[GGUFTensor]:
        alignment = int(self.metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFFormatError(f"{self.path}: alignment {alignment} is not a power of two")
        base = -(-self._pos // alignment) * alignment
        tensors = []
        for name, qtype, dims, offset in directory:
            try:
                tensor_type = GGMLQuantizationType(qtype)
                block, type_size = GGML_QUANT_SIZES[tensor_type]
            except (ValueError, KeyError):
                raise GGUFFormatError(
                    f"{self.path}: tensor {name} has unknown type {qtype}"
                ) from None
            row = dims[0] if dims else 1
            rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
            if row % block:
                raise GGUFFormatError(f"{self.path}: tensor {name}: {row} is not a whole block")
            row_bytes = row // block * type_size
            start = base + offset
            end = start + rows * row_bytes
            if end > len(self._buf):
                raise GGUFFormatError(f"{self.path}: tensor {name} runs past the end of the file")
            raw = np.frombuffer(self._buf[start:end], dtype=np.uint8)
            if tensor_type in _ELEMENT_DTYPES:  # shaped as gguf-py shapes them
                data = raw.view(_ELEMENT_DTYPES[tensor_type]).reshape(tuple(reversed(dims)))
            else:
                data = raw.reshape(rows, row_bytes)
            tensors.append(GGUFTensor(name, tensor_type, tuple(int(d) for d in dims), data))
        return tensors


# types gguf-py also exposes as numpy element arrays; every other type (blocks, bf16) is
# uint8 rows of bytes, as its dequantizers take them
_ELEMENT_DTYPES = {
    GGMLQuantizationType.F32: "<f4",
    GGMLQuantizationType.F16: "<f2",
    GGMLQuantizationType.F64: "<f8",
    GGMLQuantizationType.I8: "<i1",
    GGMLQuantizationType.I16: "<i2",
    GGMLQuantizationType.I32: "<i4",
    GGMLQuantizationType.I64: "<i8",
}
