// The Transformer-VQ facade: validates arguments (core/vq_validate.hpp), fills the kernel
// params and dispatches to the CPU kernels; vq_assign tiles each head's keys through the
// GEMM-based nearest-code search.
#include <algorithm>
#include <vector>

#include "core/validate.hpp"
#include "core/vq_validate.hpp"
#include "cpu/feature_tile.hpp"
#include "cpu/schedule.hpp"
#include "cpu/tiles.hpp"
#include "cpu/vq_assign.hpp"
#include "favor/error.hpp"
#include "favor/runtime.hpp"
#include "favor/vq.hpp"
#include "kernels/backend.hpp"

namespace favor {

VQStats vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                     MutableTensorView out, const VQOptions& options) {
  std::vector<float> codebook_copy;
  detail::AttentionShape s{};
  kernels::VQParams p = detail::vq_params(q, k, v, codebook, options, codebook_copy, &s);
  detail::check_output(out, {s.batch, s.heads, s.nq, s.dv}, "out", {q, k, v, codebook});
  p.base.out = out.data;
  p.base.out_strides = out.strides;
  VQStats stats;
  kernels::Backend& be = kernels::backend();
  stats.zero_rows = options.causal ? be.vq_causal(p) : be.vq_bidirectional(p);
  return stats;
}

Tensor vq_attention(TensorView q, TensorView k, TensorView v, TensorView codebook,
                    const VQOptions& options, VQStats* stats) {
  Tensor out = detail::attention_output(q, v);  // the callee validates fully
  const VQStats st = vq_attention(q, k, v, codebook, out.mutable_view(), options);
  if (stats) *stats = st;
  return out;
}

namespace {

// Buffers of one thread: a tile of key rows and the tile's distances to every code.
struct AssignWorkspace {
  std::vector<float> x, scratch;
  AssignWorkspace(int64_t d, int64_t codes)
      : x(cpu::kRowTile * d), scratch(cpu::kRowTile * codes) {}
};

}  // namespace

void vq_assign(TensorView k, TensorView codebook, int32_t* codes, float* distances) {
  detail::check_view(k, "k");
  detail::check_finite(k, "k");
  const int64_t heads = k.shape[1], n = k.shape[2], d = k.shape[3];
  detail::check_codebook(codebook, heads, d);
  if (codes == nullptr) throw Error("codes: null pointer; needs room for B*H*N int32 values");
  const std::vector<float> book = detail::contiguous_codebook(codebook);
  const int64_t c = codebook.shape[2];
  const int64_t book_stride = codebook.shape[1] == 1 ? 0 : c * d;
  std::vector<cpu::CodeTable> tables;
  for (int64_t g = 0; g < codebook.shape[1]; ++g)
    tables.push_back(cpu::code_table(book.data() + g * c * d, c, d));
  const int threads = num_threads();
  const cpu::Schedule plan = cpu::heads_only(k.shape[0] * heads, threads);
  std::vector<AssignWorkspace> spaces = cpu::make_workspaces<AssignWorkspace>(plan.team, d, c);
  cpu::for_each_head(plan, spaces, [&](int64_t bh, AssignWorkspace& ws) {
    const int64_t b = bh / heads, h = bh % heads;
    const int64_t g = book_stride == 0 ? 0 : h;
    const float* kh = k.data + b * k.strides[0] + h * k.strides[1];
    for (int64_t j0 = 0; j0 < n; j0 += cpu::kRowTile) {
      const int64_t rows = std::min(cpu::kRowTile, n - j0);
      cpu::gather_rows(kh + j0 * k.strides[2], k.strides[2], k.strides[3], rows, d, 1.0f,
                       ws.x.data(), nullptr);
      const int64_t at = bh * n + j0;
      cpu::nearest_codes(ws.x.data(), d, rows, tables[g], codes + at,
                         distances ? distances + at : nullptr, ws.scratch.data());
    }
    return int64_t{0};
  });
}

std::vector<int32_t> vq_assign(TensorView k, TensorView codebook) {
  detail::check_view(k, "k");
  std::vector<int32_t> codes(static_cast<size_t>(k.numel() / k.shape[3]));
  vq_assign(k, codebook, codes.data());
  return codes;
}

}  // namespace favor
