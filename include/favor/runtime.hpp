#pragma once
/// \file runtime.hpp
/// Threads and build information.
#include <string>

namespace favor {

/// Threads favor's kernels use. Initially FAVOR_NUM_THREADS if set (a positive integer),
/// else OpenMP's default. n < 1 throws favor::Error.
void set_num_threads(int n);
int num_threads();

/// One line: version, SIMD target chosen at run time, BLAS and its threading, threads.
std::string build_info();

}  // namespace favor
