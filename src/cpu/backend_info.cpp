// What the CPU backend reports about itself (kernels::Backend::tuning, describe): its tile
// sizes, the SIMD target Highway chose and the BLAS build.
#include "cpu/backend_info.hpp"

#include <cblas.h>

#include "cpu/bf16_gemm.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vec_math.hpp"
#include "cpu/vq_grad_tile.hpp"

namespace favor::cpu {
namespace {

const char* blas_threading() {
  switch (openblas_get_parallel()) {
    case 0:
      return "sequential";
    case 1:
      return "pthreads";
    case 2:
      return "openmp";
    default:
      return "unknown";
  }
}

}  // namespace

kernels::Tuning tuning() {
  return {kRowTile, kChunk, kVQBlock, kVQGradTile};
}

std::string describe() {
  return std::string("simd ") + simd_target() + "; blas " + openblas_get_config() + " (" +
         blas_threading() + " threading); bf16 " + bf16_status();
}

}  // namespace favor::cpu
