"""A GGUF file's metadata and tensor directory, read in one pass over the header; tensor
data stays in the file's read-only memory map until a loader takes it.

gguf-py's GGUFReader builds a numpy memmap view for every part of every metadata field:
on SmolLM2's 49,152-token vocabulary (plus as many merges) that is 6-20 s at start-up,
for data this reads in ~0.1 s. gguf-py stays the reference for the type tables and the
dequantizers (tests compare the two readers field by field, and the type table below with
its table); it is imported only where a tensor is dequantized in Python."""

from __future__ import annotations

import array
import math
import mmap
import struct
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32

# metadata value types (GGUF spec): struct format, array typecode (arrays of numbers are
# read in one slice; without numpy, which the API process does not otherwise import)
_SCALARS = {
    0: ("<B", "B"),
    1: ("<b", "b"),
    2: ("<H", "H"),
    3: ("<h", "h"),
    4: ("<I", "I"),
    5: ("<i", "i"),
    6: ("<f", "f"),
    7: ("<?", "B"),
    10: ("<Q", "Q"),
    11: ("<q", "q"),
    12: ("<d", "d"),
}
_BOOL = 7
_STRING, _ARRAY = 8, 9
# tensor type -> (values per block, bytes per block), as gguf.constants.GGML_QUANT_SIZES
GGML_TYPE_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
    14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98),
    19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1),
    25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
    34: (256, 54), 35: (256, 66), 39: (32, 17), 40: (64, 36), 41: (128, 18),
}  # fmt: skip
F32, F16 = 0, 1
# bounds for a file that is not what it says: a header never holds more than this
_MAX_COUNT = 1 << 28
_MAX_DIMS = 8


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor's directory entry; `shape` in GGUF order (ne[0], the row length, first)."""

    name: str
    tensor_type: int  # a GGMLQuantizationType value
    shape: tuple[int, ...]
    raw: memoryview = field(repr=False)  # the tensor's bytes in the file's memory map

    @cached_property
    def data(self) -> np.ndarray:
        """The element type for F32/F16/..., else uint8 [rows, bytes per row]: a read-only
        view of the file (numpy imported on first use)."""
        import numpy as np

        raw = np.frombuffer(self.raw, dtype=np.uint8)
        if self.tensor_type in _ELEMENT_DTYPES:  # shaped as gguf-py shapes them
            return raw.view(_ELEMENT_DTYPES[self.tensor_type]).reshape(tuple(reversed(self.shape)))
        rows = math.prod(self.shape[1:])
        if rows == 0:
            block, type_size = GGML_TYPE_SIZES.get(self.tensor_type) or _newer_type_sizes(
                self.tensor_type
            )
            return raw.reshape(0, (self.shape[0] if self.shape else 1) // block * type_size)
        return raw.reshape(rows, len(self.raw) // rows)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def n_bytes(self) -> int:
        return len(self.raw)


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

    def _strings(self, n: int) -> list[str]:
        """An array of n strings: the vocabulary and merges, ~100k of them, in a tight loop."""
        data, pos, end = self._map, self._pos, len(self._map)
        if 8 * n > end - pos:  # each string takes at least its 8-byte length
            raise GGUFFormatError(f"{self.path}: an array runs past the end of the file")
        length_at = struct.Struct("<Q").unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(n):
            (length,) = length_at(data, pos)
            pos += 8
            if pos + length > end:
                raise GGUFFormatError(f"{self.path}: a string runs past the end of the file")
            append(data[pos : pos + length].decode("utf-8", "replace"))
            pos += length
        self._pos = pos
        return out

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALARS:
            return self._unpack(_SCALARS[vtype][0])
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            item_type = self._unpack("<I")
            n = self._count()
            if item_type in _SCALARS:  # numbers in one slice
                values = array.array(_SCALARS[item_type][1])
                end = self._pos + n * values.itemsize
                if end > len(self._buf):
                    raise GGUFFormatError(f"{self.path}: an array runs past the end of the file")
                values.frombytes(self._buf[self._pos : end])
                if sys.byteorder == "big":  # the file is little-endian
                    values.byteswap()
                self._pos = end
                if item_type == _BOOL:
                    return [bool(v) for v in values]
                return values.tolist()
            if item_type == _STRING:
                return self._strings(n)
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
            sizes = GGML_TYPE_SIZES.get(qtype) or _newer_type_sizes(qtype)
            if sizes is None:
                raise GGUFFormatError(f"{self.path}: tensor {name} has unknown type {qtype}")
            block, type_size = sizes
            row = dims[0] if dims else 1
            rows = math.prod(dims[1:])
            if row % block:
                raise GGUFFormatError(f"{self.path}: tensor {name}: {row} is not a whole block")
            row_bytes = row // block * type_size
            start = base + offset
            end = start + rows * row_bytes
            if end > len(self._buf):
                raise GGUFFormatError(f"{self.path}: tensor {name} runs past the end of the file")
            tensors.append(
                GGUFTensor(name, qtype, tuple(int(d) for d in dims), self._buf[start:end])
            )
        return tensors


# types gguf-py also exposes as numpy element arrays; every other type (blocks, bf16) is
# uint8 rows of bytes, as its dequantizers take them
_ELEMENT_DTYPES = {
    0: "<f4",  # F32
    1: "<f2",  # F16
    28: "<f8",  # F64
    24: "<i1",  # I8
    25: "<i2",  # I16
    26: "<i4",  # I32
    27: "<i8",  # I64
}


def _newer_type_sizes(qtype: int) -> tuple[int, int] | None:
    """A type newer than the table above, if the installed gguf-py knows it."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        return None
