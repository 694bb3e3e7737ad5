// The causal kernel's chunk length does not change its result: the same inputs through
// cpu::favor_causal with chunks of C = 1, 5, 17 and kChunk tokens (the decay matrix
// gamma^(i-j) inside a chunk, gamma^C across chunks, learned maps, masks) agree with the
// double reference within the rule of tests/test_attention.cpp, and with each other.
#include <gtest/gtest.h>

#include <vector>

#include "core/feature_map_params.hpp"
#include "core/params.hpp"
#include "cpu/attention_params.hpp"
#include "map_fixture.hpp"
#include "test_helpers.hpp"

namespace favor::testing {
namespace {

// favor_attention's causal path with the chunk length set (the facade always uses kChunk).
Tensor causal_with_chunk(const Tensor& q, const Tensor& k, const Tensor& v, const FeatureMap& map,
                         const AttentionOptions& o, int64_t chunk) {
  const auto s = detail::check_attention_inputs(q.view(), k.view(), v.view(), true, o.key_mask);
  const detail::ResolvedMap resolved = detail::resolve_map(map, s, q.view(), k.view(), o);
  Tensor out({s.batch, s.heads, s.nq, s.dv});
  kernels::AttentionParams p =
      detail::attention_params(q.view(), k.view(), v.view(), s, resolved.scale, o.key_mask);
  p.out = out.data();
  p.out_strides = out.view().strides;
  p.map = resolved.params();
  cpu::Config config = cpu::runtime_config();
  config.chunk = chunk;
  cpu::favor_causal(p, config);
  return out;
}

void check_chunk_lengths(int64_t N) {
  const int64_t B = 2, H = 2, D = 8, Dv = 5;
  const Tensor q = random_tensor({B, H, N, D}, 61, 1.0), k = random_tensor({B, H, N, D}, 62, 1.0),
               v = random_tensor({B, H, N, Dv}, 63);
  std::vector<uint8_t> mask(B * N, 1);
  for (int64_t j = 0; j < N; j += 7) mask[j] = 0;  // batch 0: every 7th key masked
  for (Kernel kernel : {Kernel::positive, Kernel::hedgehog, Kernel::trig}) {
    for (bool decay : {false, true}) {
      const FeatureMap map =
          random_map(kernel, Projection::draw(12, D), MapSpec{H, true, true, true}, 64);
      AttentionOptions o;
      o.causal = true;
      o.key_mask = KeyMaskView::contiguous(mask.data(), B, N);
      if (decay) o.decay = {0.9, 0.5};
      const auto ref = reference::favor_attention(q, k, v, map, o);
      const auto naive32 = reference::naive::favor_attention<float>(q, k, v, map, o);
      const double naive_err = rel_error(naive32, ref.values);
      const std::string label = to_string(kernel) + (decay ? " decay" : "");
      const Tensor full = causal_with_chunk(q, k, v, map, o, cpu::kChunk);
      for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{17}, cpu::kChunk}) {
        const Tensor y = causal_with_chunk(q, k, v, map, o, chunk);
        EXPECT_LE(rel_error(y, ref.values), 2.0 * naive_err + 1e-6)
            << label << " C = " << chunk << ": naive float error " << naive_err;
        std::vector<double> full_values(full.data(), full.data() + full.numel());
        EXPECT_LE(rel_error(y, full_values), 4.0 * naive_err + 2e-6) << label << " C = " << chunk;
      }
    }
  }
}

// N = 600: the sweep projects whole chunks of up to 256 tokens at a time (kProjectBlock):
// blocks of 255 tokens for C = 5 and 17, the last one partial.
TEST(ChunkLength, DoesNotChangeTheResult) {
  for (int64_t N : {int64_t{77}, int64_t{600}}) {
    SCOPED_TRACE("N = " + std::to_string(N));
    check_chunk_lengths(N);
  }
}

}  // namespace
}  // namespace favor::testing
