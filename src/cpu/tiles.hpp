#pragma once
// Tile sizes of the FAVOR kernels.
#include <algorithm>
#include <cstdint>

#include "kernels/attention_params.hpp"

namespace favor::cpu {

/// Rows per feature tile in the bidirectional pass: 256 rows x m = 256 features x 4 B =
/// 256 KiB of features, consumed by the next GEMM while in L2 (2 MiB here); 256 measured
/// ~5% faster than 128 and no slower than 512 (favor bench, one thread, N = 16384).
constexpr int64_t kRowTile = 256;
/// Causal chunk length C: the intra-chunk product costs 2 N C (F + dv) flops on top of the
/// bidirectional 8 N m d, so short chunks save flops until per-chunk overhead wins. Measured
/// with favor bench (one thread, B*H = 8): C = 32 beat 64 by ~10% at N = 1024 and 16384,
/// and 16 at N = 1024.
constexpr int64_t kChunk = kernels::kSavedChunk;

/// Tokens whose keys and queries a causal sweep projects with one GEMM (load_block,
/// cpu/causal_chunk.hpp), eight chunks: OpenBLAS packs W again in every call, and the
/// 64 x d x m projection of one chunk ran at ~85% of the sgemm rate against ~95% for 256 rows
/// and more (one thread, d = 64, m = 256). Causal forward, one thread, B*H = 8, N = 16384:
/// 0.279 s with one chunk per GEMM, 0.272 s with 4 chunks, 0.269 s with 8 and with 16. The
/// block's 2 x 256 x m projections (512 KiB at m = 256) stay in L2.
constexpr int64_t kProjectBlock = 8 * kChunk;

/// The largest product M N K that OpenBLAS (0.3.21, SkylakeX/Cooperlake kernels) runs on its
/// small-matrix path, which neither packs nor copies its operands.
constexpr int64_t kSmallGemm = 1000000;
/// Rows of an x [rows x d] * W^T [d x m] product that stay on that path (at least 1).
inline int64_t small_gemm_rows(int64_t m, int64_t d) {
  return std::max<int64_t>(1, kSmallGemm / std::max<int64_t>(1, m * d));
}

/// Default causal block length L of Transformer-VQ attention (vq.hpp); the result does not
/// depend on it. The intra-block matrix costs 2 N L (dv + 1) flops (soft: + 2 N L c) on top
/// of the 6 N c d of the code GEMMs. Measured (one thread, B = 1, H = 8, N = 4096,
/// D = Dv = 64, c = 256, best of 12 interleaved runs): hard 0.0581 / 0.0582 / 0.0597 s and
/// soft 0.111 / 0.119 / 0.130 s for L = 32 / 64 / 128.
constexpr int64_t kVQBlock = 32;

}  // namespace favor::cpu
