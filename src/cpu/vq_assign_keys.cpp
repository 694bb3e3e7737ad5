// favor::vq_assign on the CPU (kernels::VQAssignParams): each head's keys in tiles of
// kRowTile rows through the GEMM-based nearest-code search (cpu/vq_assign.hpp), heads
// spread over threads.
#include <algorithm>
#include <vector>

#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vq_assign.hpp"

namespace favor::cpu {
namespace {

// Buffers of one thread: a tile of key rows and the tile's distances to every code.
struct AssignWorkspace {
  std::vector<float> x, scratch;
  AssignWorkspace(int64_t d, int64_t codes) : x(kRowTile * d), scratch(kRowTile * codes) {}
};

}  // namespace

void vq_assign_keys(const kernels::VQAssignParams& a, const Config& config) {
  const AttentionParams& p = a.keys.base;
  const int64_t heads = p.heads, n = p.nk, d = p.d, c = a.keys.codes;
  const std::vector<CodeTable> tables = all_code_tables(a.keys);
  const Schedule plan = heads_only(p.batch * heads, config.threads);
  std::vector<AssignWorkspace> spaces = make_workspaces<AssignWorkspace>(plan.team, d, c);
  for_each_head(plan, spaces, [&](int64_t bh, AssignWorkspace& ws) {
    const int64_t b = bh / heads, h = bh % heads;
    const int64_t g = a.keys.codebook_head_stride == 0 ? 0 : h;
    const float* kh = p.k + b * p.k_strides[0] + h * p.k_strides[1];
    for (int64_t j0 = 0; j0 < n; j0 += kRowTile) {
      const int64_t rows = std::min(kRowTile, n - j0);
      gather_rows(kh + j0 * p.k_strides[2], p.k_strides[2], p.k_strides[3], rows, d, 1.0f,
                  ws.x.data(), nullptr);
      const int64_t at = bh * n + j0;
      nearest_codes(ws.x.data(), d, rows, tables[g], a.codes + at,
                    a.distances ? a.distances + at : nullptr, ws.scratch.data());
    }
    return int64_t{0};
  });
}

}  // namespace favor::cpu
