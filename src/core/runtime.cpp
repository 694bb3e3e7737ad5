#include "favor/runtime.hpp"

#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <string>
#if defined(__GLIBC__)  // (set by <cstdlib>)
#include <malloc.h>
#endif

#include "favor/error.hpp"
#include "favor/version.hpp"
#include "kernels/backend.hpp"

namespace favor {
namespace {

std::atomic<int> g_threads{0};  // 0: not yet resolved

int threads_from_environment() {
  const char* text = std::getenv("FAVOR_NUM_THREADS");
  if (text == nullptr || *text == '\0') return omp_get_max_threads();
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 1 || n > 4096) {
    throw Error(std::string("FAVOR_NUM_THREADS: '") + text + "' must be an integer in [1, 4096]");
  }
  return static_cast<int>(n);
}

}  // namespace

void set_num_threads(int n) {
  if (n < 1) throw Error("threads: " + std::to_string(n) + " must be >= 1");
  g_threads.store(n);
}

bool release_freed_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
  return true;
#else
  return false;
#endif
}

int num_threads() {
  int n = g_threads.load();
  if (n == 0) {
    n = threads_from_environment();
    g_threads.store(n);
  }
  return n;
}

std::string build_info() {
  return std::string("favor ") + FAVOR_VERSION_STRING + "; " + kernels::backend().describe() +
         "; threads " + std::to_string(num_threads());
}

bool bf16_available() {
  return kernels::backend().has_bf16();
}

KernelInfo kernel_info() {
  const kernels::Tuning t = kernels::backend().tuning();
  return {t.row_tile, t.causal_chunk};
}

}  // namespace favor
