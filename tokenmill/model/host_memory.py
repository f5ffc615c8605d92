"""Large host buffers whose pages the kernel maps on first touch, without huge-page advice.

numpy advises huge pages on large arrays (madvise MADV_HUGEPAGE); where the kernel then
compacts memory on every fault (THP defrag=madvise), a first touch costs ~25 us per 4 KiB
page, 15x a plain fault: seconds per GiB written. An anonymous mmap gets plain faults (and
huge pages where THP hands them out without compaction)."""

from __future__ import annotations

import math
import mmap

import numpy as np


def anonymous_array(shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A zero-filled array on an anonymous private mapping (the array keeps it alive)."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
