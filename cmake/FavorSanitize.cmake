# FAVOR_SANITIZE: build every target (library, CLI, tests, benchmarks) with sanitizers.
#   ""                   off (default)
#   "address,undefined"  AddressSanitizer + UndefinedBehaviorSanitizer; UB reports abort the
#                        process (-fno-sanitize-recover), so they fail the test
#   "thread"             ThreadSanitizer
# scripts/sanitize.sh configures, builds and runs both (clang++, -O1 -gline-tables-only);
# docs/reliability.md has the run-time options, suppressions and exclusions.
set(FAVOR_SANITIZE "" CACHE STRING "Sanitizers for every target: empty, address,undefined or thread")
set_property(CACHE FAVOR_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

set(FAVOR_SANITIZE_FLAGS)
if(FAVOR_SANITIZE STREQUAL "address,undefined")
  set(FAVOR_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined)
elseif(FAVOR_SANITIZE STREQUAL "thread")
  set(FAVOR_SANITIZE_FLAGS -fsanitize=thread)
elseif(NOT FAVOR_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FAVOR_SANITIZE='${FAVOR_SANITIZE}': expected empty, address,undefined or thread")
endif()

if(FAVOR_SANITIZE_FLAGS)
  list(APPEND FAVOR_SANITIZE_FLAGS -fno-omit-frame-pointer)
  # Directory scope: every target defined after this include gets them, compile and link.
  add_compile_options(${FAVOR_SANITIZE_FLAGS})
  add_link_options(${FAVOR_SANITIZE_FLAGS})
  message(STATUS "favor: sanitizers ${FAVOR_SANITIZE} (${FAVOR_SANITIZE_FLAGS})")
endif()

# Tests that start Open MPI (MPI_Init) under AddressSanitizer: its one-time allocations are
# suppressed by library (tests/sanitizers/lsan.supp), which needs whole stacks: with the
# default frame-pointer unwinder a stack stops at the first Open MPI frame (no frame
# pointers), often in an MCA component that MPI_Finalize has dlclosed ("<unknown module>").
# Full unwinding at malloc costs ~3x on those tests. Used as ENVIRONMENT_MODIFICATION.
set(FAVOR_SANITIZE_MPI_ENV)
if(FAVOR_SANITIZE MATCHES "address")
  set(FAVOR_SANITIZE_MPI_ENV "ASAN_OPTIONS=string_append::fast_unwind_on_malloc=0")
endif()
