#!/bin/sh
# Runs the libFuzzer targets of a FAVOR_BUILD_FUZZERS=ON build one after another (`make fuzz`).
#   fuzz/run.sh BUILD_DIR SECONDS [TARGET ...]     (targets: npy npz cli attention; default all)
# Each target starts from a copy of fuzz/corpus/<target> and fuzz/regressions/<target> in
# BUILD_DIR/fuzz-corpus/<target> (libFuzzer grows the copy, never the repository's corpus),
# runs for SECONDS with one job, and its crashes land in BUILD_DIR/fuzz-artifacts/<target>/.
# FUZZ_RUNS=N stops a target after N executions (or SECONDS, whichever comes first).
# Prints the executions and seconds per target; exits 1 if a target found something.
set -u
build=$(cd "$1" && pwd)
seconds=$2
shift 2
targets=${*:-npy npz cli attention}
here=$(cd "$(dirname "$0")" && pwd)
status=0
summary=""
for t in $targets; do
  case $t in
    # malloc_limit: the largest single allocation allowed. A .npy of at most 4 KiB may
    # allocate 4 bytes per element present (docs/cli.md): far below 16 MiB; an .npz member
    # inflates at most 1032:1 (8 MiB from 8 KiB) before it is decoded.
    npy) max_len=4096 malloc_limit=16 ;;
    npz) max_len=8192 malloc_limit=64 ;;
    cli) max_len=512 malloc_limit=2048 ;;
    attention) max_len=512 malloc_limit=2048 ;;
    *) echo "fuzz/run.sh: unknown target $t" >&2; exit 2 ;;
  esac
  corpus=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  mkdir -p "$corpus" "$artifacts"
  cp -n "$here/corpus/$t/"* "$corpus/" 2>/dev/null
  find "$here/regressions/$t" -type f ! -name README.md -exec cp -n {} "$corpus/" \;
  log=$build/fuzz-$t.log
  echo "== fuzz_$t: ${seconds}s, -max_len=$max_len -malloc_limit_mb=$malloc_limit (log: $log)"
  # libomp's thread descriptors outlive LeakSanitizer's exit check (as in make asan).
  LSAN_OPTIONS=suppressions=$here/../tests/sanitizers/lsan.supp:print_suppressions=0 \
  FAVOR_NUM_THREADS=1 "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=$max_len \
    -rss_limit_mb=2048 -malloc_limit_mb=$malloc_limit -timeout=10 -print_final_stats=1 ${FUZZ_RUNS:+-runs=$FUZZ_RUNS} \
    -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  if [ $rc -ne 0 ]; then
    status=1
    tail -30 "$log"
    summary="$summary
fuzz_$t: FAILED (exit $rc) after ${runs:-?} executions: see $log and $artifacts/"
  else
    summary="$summary
fuzz_$t: ${runs:-?} executions in ${secs:-$seconds} s, corpus $(ls "$corpus" | wc -l) inputs"
  fi
done
echo "$summary"
exit $status
