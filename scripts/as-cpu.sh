#!/usr/bin/env bash
# Runs a command as a CPU with fewer instructions would run it (docs/reliability.md, "Other
# CPUs on this one"):
#   scripts/as-cpu.sh TARGET COMMAND [ARGS...]      TARGET: native avx512 avx2 sse4 scalar
#   scripts/as-cpu.sh below                          prints the next target below this CPU's
# Every library whose results depend on the instruction set is capped together:
#   favor      FAVOR_CPU: Highway's dispatch capped, bf16 off below avx512 (src/cpu/isa_cap.cpp)
#   OpenBLAS   OPENBLAS_CORETYPE: the kernel an older CPU gets (read when the library loads)
#   torch      ATEN_CPU_CAPABILITY, and MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA inside it
#   numpy      NPY_DISABLE_CPU_FEATURES (its baseline, x86-64-v2, stays)
#   inductor   a compile cache of its own per target (TORCHINDUCTOR_CACHE_DIR): torch 2.13's cache
#              key leaves ATEN_CPU_CAPABILITY out, and kernels generated for AVX-512 (16 floats a
#              vector) compiled again for AVX2 (8) wrote out of bounds: wrong sums, heap damage
# A cap above the CPU does not add instructions: the libraries ignore what the CPU lacks.
# `make test FAVOR_CPU=avx2` runs the whole suite this way; AVX-512 without BF16 is
# FAVOR_CPU=avx512 FAVOR_NO_BF16=1.
set -euo pipefail

has() { grep -qw "$1" /proc/cpuinfo; }

if [[ ${1:-} == below ]]; then  # the next target below this CPU's best
  if has avx512f; then echo avx2; elif has avx2; then echo sse4; else echo scalar; fi
  exit 0
fi
if [[ $# -lt 2 ]]; then
  echo "usage: $0 native|avx512|avx2|sse4|scalar COMMAND [ARGS...] | $0 below" >&2
  exit 2
fi
target=$1
shift
case "$target" in
  native) exec "$@" ;;
  avx512) core=SkylakeX aten=avx512 mkl=AVX512 dnnl=AVX512_CORE npy="AVX512_ICL AVX512_SPR" ;;
  avx2) core=Haswell aten=avx2 mkl=AVX2 dnnl=AVX2 npy="X86_V4 AVX512_ICL AVX512_SPR" ;;
  sse4) core=Nehalem aten=default mkl=SSE4_2 dnnl=SSE41 npy="X86_V3 X86_V4 AVX512_ICL AVX512_SPR" ;;
  scalar) core=Prescott aten=default mkl=SSE4_2 dnnl=SSE41 npy="X86_V3 X86_V4 AVX512_ICL AVX512_SPR" ;;
  *)
    echo "as-cpu: '$target' must be native, avx512, avx2, sse4 or scalar" >&2
    exit 2
    ;;
esac
export FAVOR_CPU=$target OPENBLAS_CORETYPE=$core ATEN_CPU_CAPABILITY=$aten
export MKL_ENABLE_INSTRUCTIONS=$mkl ONEDNN_MAX_CPU_ISA=$dnnl NPY_DISABLE_CPU_FEATURES=$npy
export TORCHINDUCTOR_CACHE_DIR=${TMPDIR:-/tmp}/torchinductor_$(id -un)_favor_cpu_$target
exec "$@"
