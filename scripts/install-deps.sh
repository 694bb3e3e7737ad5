#!/usr/bin/env bash
# Installs the Debian packages favor needs, if any is missing. Runs apt-get as root (or
# through sudo when not root). Safe to run again: does nothing when all are present.
set -euo pipefail

packages=(
  g++ make cmake pkg-config        # toolchain (CMake >= 3.25)
  ninja-build ccache               # faster builds: Ninja, and the compiler cache that the
                                   # pip-install test's build shares (cmake/FavorCcache.cmake)
  libopenblas-openmp-dev           # the fallback BLAS (-DFAVOR_BLAS=openblas); favor links PyPI's
                                   # scipy-openblas32 from the venv (cmake/FindFavorBLAS.cmake)
  libeigen3-dev                    # QR of the orthogonal projection blocks, FAVOR# eigenvectors
  libboost-dev                     # Boost.Math (chi quantiles, inverse normal CDF), Sobol points
  libhwy-dev                       # Highway: run-time dispatched SIMD exp/log/sin/cos
  libdnnl-dev                      # oneDNN: bf16 GEMMs on CPUs with AVX512-BF16 (optional in CMake)
  libcli11-dev libfmt-dev nlohmann-json3-dev zlib1g-dev   # the favor CLI (zlib: .npz map files)
  libgtest-dev libbenchmark-dev    # tests, the Google Benchmark target
  python3-dev python3-venv          # the Python package's base interpreter (Debian's /usr/bin/python3);
                                   # its packages come from PyPI into .venv: scripts/setup-venv.sh
  libopenmpi-dev openmpi-bin      # the distributed layer (favor::distributed; mpi4py's wheel loads it)
  clang libclang-rt-14-dev libomp-dev   # the hardening builds: clang++ (golden values), ASan+UBSan, TSan, libFuzzer
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  run=()
elif command -v sudo >/dev/null 2>&1; then
  run=(sudo)
else
  echo "install-deps: missing packages (${missing[*]}) and not root; run as root or install them" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${run[@]}" apt-get update -qq
"${run[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
