# The two commands of the README:
#   make run   installs missing Debian packages, builds (Release) and runs `favor demo`
#   make test  installs, builds and runs the whole test suite through CTest
# Sanitizers (clang++; scripts/sanitize.sh, docs/reliability.md):
#   make asan      AddressSanitizer + UBSan build in build-asan, the whole C++ suite
#   make tsan      ThreadSanitizer build in build-tsan, the multi-threaded tests
#   make sanitize  both (run by .ci/run after make test)
BUILD_DIR ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all deps build run test install clean format asan tsan sanitize

all: build

deps:
	@scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	$(BUILD_DIR)/tools/favor demo

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

asan: deps
	JOBS=$(JOBS) scripts/sanitize.sh asan

tsan: deps
	JOBS=$(JOBS) scripts/sanitize.sh tsan

sanitize: asan tsan

install: build
	cmake --install $(BUILD_DIR)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.hpp')

clean:
	rm -rf $(BUILD_DIR)
