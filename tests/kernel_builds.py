"""The C kernels in each build the tests compare: this CPU's (AVX-512 where it has it), AVX2
and portable x86-64."""

from __future__ import annotations

import pytest

from tokenmill.kernels.build import build_kernels

KERNEL_BUILDS = ["native", "haswell", "x86-64"]


def kernel_build(march: str):
    """The kernels built for -march=`march`; the calling test skips without a C compiler."""
    lib = build_kernels(march)
    if lib is None:
        pytest.skip("no C compiler")
    return lib
