#pragma once
// How the CPU backend runs a kernel: the thread team and the causal chunk length. Not part of
// the kernel contract (kernels/): another device has its own configuration.
#include <cstdint>

#include "cpu/tiles.hpp"

namespace favor::cpu {

struct Config {
  int threads = 1;         // OpenMP threads a kernel may use, >= 1
  int64_t chunk = kChunk;  // causal forward: chunk length C, 1 .. kChunk (the tests vary it)
};

/// The configuration of favor's runtime: num_threads() threads, chunks of kChunk.
Config runtime_config();

}  // namespace favor::cpu
