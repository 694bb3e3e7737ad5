#pragma once
// The io section of `favor bench`: the whole `favor attention` process on .npy files (start,
// mapping the inputs, the call, writing the output), timed against the same call made inside
// this process in the same run.
#include <cstdint>
#include <nlohmann/json.hpp>

namespace favor::cli {

struct IoBenchArgs {
  int64_t n = 16384, bh = 8, d = 64, m = 256;
  int threads = 1;
  int repeats = 3;  ///< timed runs after a warm-up (the median)
  bool json = false;
};

/// Rows for float32 and float64 inputs (float64 is converted on reading), bidirectional and
/// causal: compute_seconds (in process), process_seconds (wall time of the child process) and
/// process_over_compute. Files live in a temporary folder, removed afterwards.
nlohmann::json io_section(const IoBenchArgs& args);

}  // namespace favor::cli
