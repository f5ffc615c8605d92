"""The C kernels in each build the tests compare: this CPU's (AVX-512 where it has it), AVX2
and portable x86-64; for the integer-dot GEMM also this CPU's with its AMX tiles run on the
software model of the tiles (amx_tiles.h), where the CPU has AVX-512 VNNI."""

from __future__ import annotations

import pytest

from tokenmill.kernels.build import build_kernels

KERNEL_BUILDS = ["native", "haswell", "x86-64"]
AMX_EMULATED = "amx-emulated"  # this CPU's build, the GEMM's AMX tiles on the tiles' model


def kernel_build(march: str):
    """The kernels built for -march=`march` (or AMX_EMULATED); the calling test skips without a
    C compiler, or AMX_EMULATED's without AVX-512 VNNI (the AMX kernel's other half)."""
    emulated = march == AMX_EMULATED
    lib = build_kernels("native", ("TM_AMX_EMULATE",)) if emulated else build_kernels(march)
    if lib is None:
        pytest.skip("no C compiler")
    if emulated and lib.tm_int_dot_kind() != 3:
        pytest.skip("the AMX tiles' model runs beside AVX-512 VNNI, which this CPU lacks")
    return lib
