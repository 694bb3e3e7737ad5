// What the CPU backend reports about itself (kernels::Backend::tuning, describe): its tile
// sizes, the SIMD target Highway chose and the BLAS build.
#include "cpu/backend_info.hpp"

#include <cpuid.h>
#include <favor_openblas.h>  // the linked OpenBLAS (cmake/FindFavorBLAS.cmake)

#include <cstring>

#include "cpu/bf16_gemm.hpp"
#include "cpu/isa_cap.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_grad_tile.hpp"

namespace favor::cpu {
namespace {

// How the BLAS runs favor's calls: scipy-openblas32 is set to one thread (src/cpu/blas.cpp);
// the system's OpenMP build runs on the calling thread inside favor's regions.
const char* blas_threading() {
  switch (FAVOR_OPENBLAS(openblas_get_parallel)()) {
    case 0:
      return "sequential";
    case 1:
      return FAVOR_OPENBLAS_SCIPY ? "scipy-openblas32, pthreads, set to 1 thread" : "pthreads";
    case 2:
      return "openmp threading";
    default:
      return "unknown threading";
  }
}

// FAVOR_CPU's cap and, where the BLAS's kernel is beyond it, why.
std::string cap_text() {
  const IsaCap& cap = isa_cap();
  if (cap.name.empty()) return "";
  const std::string mismatch = blas_cap_mismatch();
  return "; cpu cap " + cap.name + " (FAVOR_CPU)" + (mismatch.empty() ? "" : ": " + mismatch);
}

}  // namespace

std::string cpu_model() {
  unsigned regs[12] = {};
  unsigned top = __get_cpuid_max(0x80000000u, nullptr);
  if (top < 0x80000004u) return "unknown x86-64";
  for (unsigned i = 0; i < 3; ++i)
    __get_cpuid(0x80000002u + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2],
                &regs[4 * i + 3]);
  char brand[49] = {};
  std::memcpy(brand, regs, 48);
  std::string text(brand);
  const auto first = text.find_first_not_of(' ');
  const auto last = text.find_last_not_of(' ');
  return first == std::string::npos ? "unknown x86-64" : text.substr(first, last - first + 1);
}

kernels::Tuning tuning() {
  return {kRowTile, kChunk, kVQBlock, kVQGradTile};
}

std::string describe() {
  return "cpu " + cpu_model() + "; simd " + simd_target() + "; blas " +
         FAVOR_OPENBLAS(openblas_get_config)() + " (" + blas_threading() + "); bf16 " +
         bf16_status() + cap_text();
}

}  // namespace favor::cpu
