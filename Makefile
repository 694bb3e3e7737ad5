# The two commands of the README:
#   make run   installs missing Debian packages, makes the project venv with only the BLAS
#              libfavor links (.venv; scipy-openblas32 pinned in requirements.txt: no torch or
#              transformers), builds what the demo needs (libfavor and the `favor` tool,
#              Release) and runs `favor demo`
#   make test  the same set-up plus the whole venv (installed beside the C++ build, which needs
#              only its BLAS and pybind11), builds everything, then the whole test suite (C++
#              and Python) through CTest
# FAVOR_CPU=avx512|avx2|sse4|scalar runs `make run` or `make test` as a CPU with fewer
# instructions would (scripts/as-cpu.sh; docs/reliability.md, "Other CPUs on this one").
# Sanitizers (clang++; scripts/sanitize.sh, docs/reliability.md):
#   make asan      AddressSanitizer + UBSan build in build-asan, the whole C++ suite
#   make tsan      ThreadSanitizer build in build-tsan, the multi-threaded tests
#   make sanitize  both (run by .ci/run after make test)
# make wheel: favor's wheel in dist/, repaired to install on any Linux x86-64 with this
# glibc or newer (scripts/build-wheel.sh; docs/python.md)
BUILD_DIR ?= build
VENV ?= .venv
PYTHON := $(abspath $(VENV))/bin/python
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= npy npz cli attention

# The commands that run favor, under the FAVOR_CPU cap when one is given.
AS_CPU = $(if $(FAVOR_CPU),scripts/as-cpu.sh $(FAVOR_CPU))

.PHONY: all deps deps-demo deps-build configure configure-demo configure-build build build-demo run test install clean format asan tsan sanitize fuzz wheel docs-test

all: build

deps:
	@scripts/install-deps.sh
	@FAVOR_VENV=$(VENV) scripts/setup-venv.sh

# Ninja (Debian ninja-build) for a new build tree, as pip's build of the wheel uses: the
# pip-install test's compiles then match the main build's and hit its compiler cache
# (cmake/FavorCcache.cmake). An existing tree keeps its generator; so does CMAKE_GENERATOR.
# Expanded when the recipe runs, after deps has installed ninja.
NEW_TREE_GENERATOR = $(if $(wildcard $(BUILD_DIR)/CMakeCache.txt)$(CMAKE_GENERATOR),,\
                       $(if $(shell command -v ninja),-G Ninja))

CONFIGURE = cmake -S . -B $(BUILD_DIR) $(NEW_TREE_GENERATOR) -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE=$(PYTHON) -DFAVOR_PYTHON=$(PYTHON)

configure: deps
	$(CONFIGURE)

# make run's set-up: the Debian packages and the venv's BLAS only (the Python package is
# then off in CMake, said in its output; `make test` configures again with the full venv).
deps-demo:
	@scripts/install-deps.sh
	@FAVOR_VENV=$(VENV) scripts/setup-venv.sh --blas-only

configure-demo: deps-demo
	$(CONFIGURE)

# make build (and so make test): configured with the venv's BLAS and pybind11 only; the rest
# of the venv (torch, transformers, ...: ~65 s, mostly one core) installs beside the C++
# build, which needs nothing of it, and the target waits for both.
deps-build:
	@scripts/install-deps.sh
	@FAVOR_VENV=$(VENV) scripts/setup-venv.sh --build-only

configure-build: deps-build
	$(CONFIGURE)

build: configure-build
	@FAVOR_VENV=$(VENV) scripts/setup-venv.sh > $(BUILD_DIR)/setup-venv.log 2>&1 & venv=$$!; \
	cmake --build $(BUILD_DIR) -j $(JOBS); rc=$$?; \
	if ! wait $$venv; then cat $(BUILD_DIR)/setup-venv.log; \
	  echo "make build: scripts/setup-venv.sh failed (its log above)"; exit 1; fi; \
	cat $(BUILD_DIR)/setup-venv.log; exit $$rc

# Only what the demo runs: libfavor and the command-line tool (not the tests, fuzzers,
# benchmarks or the Python extension, which `make test` builds).
build-demo: configure-demo
	cmake --build $(BUILD_DIR) -j $(JOBS) --target favor_cli_main

run: build-demo
	$(AS_CPU) $(BUILD_DIR)/tools/favor demo

# After CTest, pytest's own summary line of every Python test file or group of small files
# (python/CMakeLists.txt; from CTest's log), so the log shows the Python suite ran in the
# project's venv, then the ten slowest tests (where CI's time goes).
test: build
	@$(AS_CPU) $(BUILD_DIR)/tools/favor --version | sed 's/^/make test runs on: /'
	$(AS_CPU) ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS) -LE isa_only; rc=$$?; \
	echo "pytest summaries (.venv/bin/python, one CTest test per file or group of small files):"; \
	awk '/^[0-9]+\/[0-9]+ Testing: /{name=$$3} name ~ /^python_(test|group)_/ && / in [0-9.]+s/ {print "  " name ": " $$0}' \
	    $(BUILD_DIR)/Testing/Temporary/LastTest.log; \
	echo "the ten slowest tests (CTest's times; they run two at a time):"; \
	awk '/^[0-9]+\/[0-9]+ Test: /{name=$$3} /^Test time =/{print $$4, name}' \
	    $(BUILD_DIR)/Testing/Temporary/LastTest.log | sort -rn | head -10 | \
	    awk '{printf "  %7.1f s  %s\n", $$1, $$2}'; exit $$rc

wheel: deps
	FAVOR_WHEEL_PYTHON=$(PYTHON) scripts/build-wheel.sh . dist

asan: deps
	JOBS=$(JOBS) scripts/sanitize.sh asan

tsan: deps
	JOBS=$(JOBS) scripts/sanitize.sh tsan

sanitize: asan tsan

# libFuzzer targets (fuzz/, docs/reliability.md): a clang build with ASan + UBSan, then each
# target for FUZZ_SECONDS on a copy of its seed corpus. Not part of `make test` (which replays
# the seeds and the fixed crashes through the same code: CTest fuzz_replay_*).
fuzz: deps
	cmake -S . -B $(FUZZ_DIR) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ \
	  -DFAVOR_BUILD_FUZZERS=ON -DFAVOR_BUILD_TESTS=OFF -DFAVOR_BUILD_BENCH=OFF \
	  -DFAVOR_BUILD_PYTHON=OFF -DFAVOR_MPI=OFF -DBUILD_SHARED_LIBS=OFF
	cmake --build $(FUZZ_DIR) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_TARGETS))
	fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

install: build
	cmake --install $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf $(BUILD_DIR)
