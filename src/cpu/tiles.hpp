#pragma once
// Tile sizes of the FAVOR kernels.
#include <cstdint>

namespace favor::cpu {

/// Rows per feature tile in the bidirectional pass: 128 rows x m=256 features x 4 B =
/// 128 KiB of features, which stays in L2 while it is consumed by the next GEMM.
constexpr int64_t kRowTile = 256;
/// Causal chunk length C: the intra-chunk product costs 2 N C (F + dv) flops, the
/// inter-chunk products 4 N F dv; C = 64 keeps the first well below the second for
/// F >= 128 while the chunk GEMMs stay large enough to run near peak.
constexpr int64_t kChunk = 64;

}  // namespace favor::cpu
