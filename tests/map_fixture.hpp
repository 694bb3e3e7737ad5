#pragma once
// Feature maps with learned parameters for the tests (test_feature_map.cpp, test_decay.cpp,
// test_map_gradients.cpp), the forward check against the double reference and the decoder
// drivers shared by test_feature_map.cpp and test_decay.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor::testing {

/// Which learned parameters a test map has, in how many sets (1, H or B*H).
struct MapSpec {
  int64_t heads = 1;
  bool weights = false, bias = false, lambda = false;
};

inline std::string spec_name(const MapSpec& s) {
  if (!s.weights && !s.bias && !s.lambda) return "plain";
  return std::string(s.weights ? "W" : "") + (s.bias ? "b" : "") + (s.lambda ? "lambda" : "") +
         "_sets" + std::to_string(s.heads);
}

/// A map of w with the parameters of `spec` drawn near the fixed map: each head's W_h = W +
/// 0.3 N(0, 1), b ~ 0.5 N(0, 1), lambda = +-U(0.5, 1.5) (both signs: only lambda^2 counts,
/// and dL/dlambda is odd in lambda). `seed` and `stream` pick the draws.
inline FeatureMap random_map(Kernel kernel, const Projection& w, const MapSpec& spec, uint64_t seed,
                             uint64_t stream = 777) {
  FeatureMap map(w, kernel);
  if (!spec.weights && !spec.bias && !spec.lambda) return map;
  map.learnable(spec.heads, spec.weights, spec.bias, spec.lambda);
  detail::Rng rng(seed, stream);
  for (float& x : map.weights) x += static_cast<float>(0.3 * rng.normal());
  for (float& x : map.bias) x = static_cast<float>(0.5 * rng.normal());
  for (float& x : map.lambda) {
    const double sign = rng.uniform_open() < 0.5 ? -1.0 : 1.0;
    x = static_cast<float>(sign * (0.5 + rng.uniform_open()));
  }
  return map;
}

/// Runs favor_attention with `map` and checks it against the double reference with the rule
/// of tests/test_attention.cpp (docs/numerics.md): the float32 result's error is at most twice
/// that of a naive float32 evaluation of the same formula (reference::naive, same map, decay
/// and mask), plus 8 float32 ulps of slack (1e-6). Returns the fast result.
inline Tensor expect_near_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const FeatureMap& map, const AttentionOptions& o,
                                    const std::string& label, AttentionStats* stats = nullptr) {
  const Tensor fast = favor_attention(q, k, v, map, o, stats);
  const auto ref = reference::favor_attention(q, k, v, map, o);
  const auto naive32 = reference::naive::favor_attention<float>(q, k, v, map, o);
  const double err = rel_error(fast, ref.values);
  const double naive_err = rel_error(naive32, ref.values);
  EXPECT_LE(err, 2.0 * naive_err + 1e-6) << label << ": naive float error " << naive_err;
  return fast;
}

/// Runs a decoder over all N tokens of k, v, appending them in groups of the sizes in
/// `groups` (then one at a time) and querying, after each group, with the query of its last
/// token. Returns the rows queried (the others stay zero) and their indices in *queried.
inline Tensor decode(Decoder& dec, const Tensor& q, const Tensor& k, const Tensor& v,
                     const std::vector<int64_t>& groups, std::vector<int64_t>* queried) {
  const int64_t B = q.shape()[0], H = q.shape()[1], N = q.shape()[2], Dv = v.shape()[3];
  Tensor out({B, H, N, Dv});
  queried->clear();
  for (size_t g = 0, i = 0; static_cast<int64_t>(i) < N; ++g) {
    const int64_t T = g < groups.size() ? groups[g] : 1, first = static_cast<int64_t>(i);
    dec.append(tokens(k, first, T), tokens(v, first, T));
    i += static_cast<size_t>(T);
    const int64_t last = first + T - 1;
    const Tensor y = dec.query(tokens(q, last));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x) out.at(b, h, last, x) = y.at(b, h, 0, x);
    queried->push_back(last);
  }
  return out;
}

/// Relative Frobenius error of rows `rows` (axis 2) of approx against exact.
inline double rows_rel_error(const Tensor& approx, const Tensor& exact,
                             const std::vector<int64_t>& rows) {
  double diff = 0, norm = 0;
  for (int64_t b = 0; b < exact.shape()[0]; ++b)
    for (int64_t h = 0; h < exact.shape()[1]; ++h)
      for (int64_t i : rows)
        for (int64_t x = 0; x < exact.shape()[3]; ++x) {
          const double e = exact.at(b, h, i, x), a = approx.at(b, h, i, x);
          diff += (a - e) * (a - e);
          norm += e * e;
        }
  return std::sqrt(diff / norm);
}

}  // namespace favor::testing
