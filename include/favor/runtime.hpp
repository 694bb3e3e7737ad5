#pragma once
/// \file runtime.hpp
/// Threads and build information.
#include <cstdint>
#include <string>

namespace favor {

/// Threads favor's kernels use. Initially FAVOR_NUM_THREADS if set (a positive integer),
/// else OpenMP's default. n < 1 throws favor::Error.
void set_num_threads(int n);
int num_threads();

/// One line: version, the CPU (its brand string), the SIMD target chosen at run time, the BLAS
/// (its kernel) and its threading, bf16, the FAVOR_CPU cap when set, threads.
std::string build_info();

/// Whether AttentionOptions::precision = bf16 runs in bf16 here: the CPU has AVX512-BF16,
/// favor was built with oneDNN, and FAVOR_NO_BF16 is unset (or "" or "0"). Checked per call.
bool bf16_available();

/// Gives the memory the process has freed but its allocator still holds back to the system
/// (glibc's malloc_trim; elsewhere nothing) and returns whether it could. Large buffers
/// freed between calls of different sizes stay in glibc's arenas once its mmap threshold
/// has grown past them: favor.hf calls this after each layer's prompt (docs/hf.md,
/// "Memory"), so that a long prompt's per-layer buffers do not add up.
bool release_freed_memory();

/// Tile sizes of the CPU kernels, for cost models and benchmarks.
struct KernelInfo {
  int64_t row_tile;      ///< rows per feature tile (bidirectional)
  int64_t causal_chunk;  ///< chunk length C of causal attention
};
KernelInfo kernel_info();

}  // namespace favor
