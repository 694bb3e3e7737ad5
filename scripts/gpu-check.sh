#!/usr/bin/env bash
# favor's GPU run (docs/gpu.md, "On a lent GPU"): on a machine with a CUDA device, build the
# Python extension with that machine's python3 (its torch and triton), run the GPU suite
# (python/tests/gpu) and the benchmark (python -m favor.bench_gpu), and leave the logs and
# tables in ${OUT:-gpu_results}. Build dependencies missing there (OpenBLAS, Eigen, Boost,
# Highway headers: Debian packages) travel as .deb files in .gpu-debs/, fetched here with
#   mkdir -p .gpu-debs && (cd .gpu-debs && apt-get download libopenblas0-openmp \
#     libopenblas-openmp-dev libopenblas-dev libeigen3-dev libboost-dev libhwy-dev libhwy1 \
#     libgomp1)
# and unpacked there into /. Not run by CI (no GPU there); written for the H200 that is lent
# to some sessions: one call of about ten minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_results}
mkdir -p "$out"
if ls .gpu-debs/*.deb >/dev/null 2>&1; then
  for f in .gpu-debs/*.deb; do dpkg -x "$f" /; done
  ldconfig
fi
python=$(command -v python3)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/device.txt" || true
"$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
  | tee -a "$out/device.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFAVOR_BUILD_TOOLS=OFF \
  -DFAVOR_BUILD_TESTS=OFF -DFAVOR_BUILD_BENCH=OFF -DFAVOR_MPI=OFF \
  -DPython_EXECUTABLE="$python" > "$out/build.log" 2>&1
cmake --build build-gpu --target favor_python_package -j "$(nproc)" >> "$out/build.log" 2>&1
export PYTHONPATH=$PWD/build-gpu/python PYTHONUNBUFFERED=1
rc=0
(cd python/tests && "$python" -m pytest -q -p no:cacheprovider gpu) 2>&1 | tee "$out/tests.log" \
  || rc=1
"$python" -m favor.bench_gpu --out "$out" "$@" 2>&1 | tee "$out/bench.log" || rc=1
exit $rc
