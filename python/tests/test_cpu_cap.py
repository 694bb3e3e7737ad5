"""FAVOR_CPU (scripts/as-cpu.sh): under the switch every library this suite's results depend on
runs within the cap, so that a green run under it means what it says: favor's SIMD target, its
bf16 and its BLAS kernel (favor.build_info()), torch's ATen kernels and numpy's dispatch."""
import os

import numpy as np
import pytest

import favor

CAP = os.environ.get("FAVOR_CPU", "")
# The best SIMD target favor may run under each cap (Highway's names), torch's capability.
FAVOR_TARGETS = {"avx512": ("AVX3", "AVX2", "SSE4", "SSSE3", "SCALAR", "EMU128"),
                 "avx2": ("AVX2", "SSE4", "SSSE3", "SCALAR", "EMU128"),
                 "sse4": ("SSE4", "SSSE3", "SCALAR", "EMU128"),
                 "scalar": ("SCALAR", "EMU128")}
TORCH = {"avx512": ("AVX512", "AVX2", "DEFAULT"), "avx2": ("AVX2", "DEFAULT"),
         "sse4": ("DEFAULT",), "scalar": ("DEFAULT",)}


def simd_target(info):
    return info.split("; simd ")[1].split(";")[0]


def test_favor_runs_within_the_cap():
    info = favor.build_info()
    print(info)
    if CAP in ("", "native"):
        assert "cpu cap" not in info
        return
    assert simd_target(info) in FAVOR_TARGETS[CAP], info
    assert f"cpu cap {CAP} (FAVOR_CPU)" in info, info
    assert "beyond FAVOR_CPU" not in info, info  # the BLAS's kernel is within the cap
    if CAP != "avx512":
        assert not favor.bf16_available()


@pytest.mark.skipif(CAP in ("", "native"), reason="no FAVOR_CPU cap")
def test_torch_and_numpy_run_within_the_cap():
    torch = pytest.importorskip("torch")
    assert torch.backends.cpu.get_cpu_capability() in TORCH[CAP]
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    beyond = {"avx512": ("AVX512_ICL", "AVX512_SPR"),
              "avx2": ("X86_V4", "AVX512_ICL", "AVX512_SPR")}.get(
                  CAP, ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR"))
    for target in beyond:
        if target in __cpu_dispatch__:
            assert not __cpu_features__.get(target, False), (target, np.__version__)
