#pragma once
// Hard VQ's straight-through key gradient, dk_j = scale sum_i W_{i,z_j} (dy_i . v_j -
// delta_i) q_i (notation of cpu/vq_grad_tile.hpp; causal: over the queries of later blocks),
// by the cheaper of two routes per code, chosen per head from n_s, the code's visible keys:
//   - moments: T_s = sum_i W_is q_i dy_i^T and w_s = sum_i W_is delta_i q_i, then
//     dk_j = scale (T_s v_j - w_s): 2 N d dv flops for the code whatever n_s;
//   - direct: M = dY V_{J_s}^T, M'_ij = W_is (M_ij - delta_i), dk_{J_s} += scale M'^T Q:
//     2 N n_s (d + dv) flops.
// A code goes direct when n_s (d + dv) < d dv, i.e. n_s <= kmax = (d dv - 1) / (d + dv), so
// the direct keys of a head number at most c kmax < c d dv / (d + dv), whatever N. Both
// routes sum the same terms, so the result is the same within float rounding; the choice
// depends only on the head's keys (not on the threads, the tile or the block length).
// Sequence-parallel attention puts every code on the moment route (all_moments): the queries
// of the other ranks reach this rank's keys only through their moments, and this rank's
// queries must give the moments of every code to the keys of the others.
#include <cstdint>
#include <vector>

namespace favor::cpu {

class KeyRoutes {
 public:
  // tile: the most query rows per accumulate(); nk: the head's keys (bounds the direct keys);
  // all_moments: every code on the moment route, numbered as in the codebook (no direct key).
  KeyRoutes(int64_t c, int64_t d, int64_t dv, int64_t tile, int64_t nk, bool all_moments = false);

  /// Starts a head.
  void reset();
  /// Counts the keys [start, start + rows) (code z, -1 when masked, value rows v), keeping
  /// those that may yet go direct, in key order.
  void add_keys(const int32_t* z, const float* v, int64_t start, int64_t rows);
  /// After every key was added: fixes the routes (direct keys in key order, moment codes
  /// numbered in code order) and clears the direct keys' gradient.
  void finish();

  /// Codes on the moment route; P columns for them: moment_columns.
  int64_t moment_codes() const { return moment_codes_; }
  /// The moment codes' columns of P (rows x c) as a rows x moment_codes() matrix.
  const float* moment_columns(const float* P, int64_t rows);
  /// z mapped to the moment codes' numbering, -1 for masked keys and direct codes.
  const int32_t* moment_codes_of(const int32_t* z, int64_t rows);

  /// Direct keys with index < end (all: end = the head's keys).
  int64_t direct_before(int64_t end) const;
  /// Direct route for the first `keys` direct keys from `rows` queries with weights P
  /// (rows x c), q (rows x d), dy (rows x dv) and delta: dk_direct += scale M'^T q.
  void accumulate(const float* P, const float* q, const float* dy, const float* delta, int64_t rows,
                  int64_t keys, float scale);
  /// dk[key] += the direct keys' gradient (dk: the head's N x d rows).
  void scatter(float* dk) const;

 private:
  int64_t c_, d_, dv_, kmax_, moment_codes_ = 0, keys_ = 0;
  std::vector<int64_t> count_, key_;
  std::vector<int32_t> code_, slot_, zt_;
  std::vector<float> v_, dk_, m_, pt_;
};

}  // namespace favor::cpu
