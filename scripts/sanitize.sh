#!/usr/bin/env bash
# Sanitizer builds (clang++, -O1 -gline-tables-only, every target built with -fsanitize;
# cmake/FavorSanitize.cmake) and their test runs. docs/reliability.md explains the options,
# suppressions and exclusions.
#   scripts/sanitize.sh asan   AddressSanitizer + UBSan in build-asan: the whole C++ suite (ctest)
#   scripts/sanitize.sh tsan   ThreadSanitizer in build-tsan: the multi-threaded tests
#   scripts/sanitize.sh        both
# Environment: JOBS (default nproc), CXX_SAN (default clang++), SANITIZE_MPI=1 to build the
# ASan suite with MPI (favor::distributed, the mpirun tests: ~1 min more to build and ~2.5 min
# more to run on 2 cores, outside the CI budget; off by default).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
cxx=${CXX_SAN:-clang++}
supp=$root/tests/sanitizers

# -gline-tables-only: the reports' stacks keep every frame's function, file and line (inlined
# frames too), without the types and variables of full -g, which cost ~15% more compile time.
configure() {  # build dir, FAVOR_SANITIZE, FAVOR_MPI
  # Ninja for a new tree when installed (the Makefile's rule); an existing tree keeps its own.
  local generator=()
  if [[ ! -f $1/CMakeCache.txt && -z ${CMAKE_GENERATOR:-} ]] && command -v ninja >/dev/null; then
    generator=(-G Ninja)
  fi
  cmake -S . -B "$1" "${generator[@]}" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DFAVOR_SANITIZE="$2" -DFAVOR_MPI="$3" \
    -DFAVOR_BUILD_PYTHON=OFF -DFAVOR_BUILD_BENCH=OFF
}

asan() {
  # LSan: Open MPI's one-time allocations are suppressed by library (lsan.supp); UBSan: any
  # report aborts the test (-fno-sanitize-recover=undefined) with a stack.
  export ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1
  export LSAN_OPTIONS=suppressions=$supp/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  local mpi=OFF
  if [[ ${SANITIZE_MPI:-0} == 1 ]]; then mpi=ON; fi
  configure build-asan address,undefined "$mpi"
  cmake --build build-asan -j "$jobs"
  ctest --test-dir build-asan --output-on-failure -j "$jobs"
}

tsan() {
  # Archer (LLVM's OMPT tool) tells TSan about libomp's barriers, tasks and reductions.
  # OpenBLAS (scipy-openblas32, or Debian's libgomp build with -DFAVOR_BLAS=openblas) is not
  # instrumented: it runs on the calling thread (libfavor sets it to one thread;
  # OPENBLAS_NUM_THREADS=1 for the other build), and TSan ignores accesses inside
  # uninstrumented libraries.
  local archer
  archer=$("$cxx" -print-file-name=libarcher.so)
  if [[ ! -f $archer ]]; then archer=/usr/lib/llvm-14/lib/libarcher.so; fi
  export OMP_TOOL_LIBRARIES=$archer
  export OPENBLAS_NUM_THREADS=1
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp"
  configure build-tsan thread OFF
  cmake --build build-tsan -j "$jobs" --target favor_thread_tests
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L threads
}

case "${1:-all}" in
  asan) asan ;;
  tsan) tsan ;;
  all) (asan) && (tsan) ;;
  *) echo "usage: $0 [asan|tsan|all]" >&2; exit 2 ;;
esac
