#pragma once
// Helpers of the MPI tests: every rank builds the same full inputs and the single-process
// oracle, takes its own slice along N, and compares its slice of the distributed result.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "favor/distributed.hpp"
#include "favor/favor.hpp"
#include "test_helpers.hpp"

namespace favor::mpitest {

using distributed::Slice;

inline int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// An uneven split: rank r gets a share of n proportional to weight (r + salt) % 5 of
/// {3, 1, 0, 2, 5}, so with salt 0 and P >= 3 rank 2 holds nothing, with salt 1 rank 1.
inline Slice uneven_slice(int64_t n, int r, int p, int salt = 0) {
  static const int64_t weights[] = {3, 1, 0, 2, 5};
  const auto weight = [salt](int i) { return weights[(i + salt) % 5]; };
  int64_t total = 0, before = 0;
  for (int i = 0; i < p; ++i) total += weight(i);
  if (total == 0) return distributed::even_slice(n, r, p);
  for (int i = 0; i < r; ++i) before += weight(i);
  return {n * before / total, n * (before + weight(r)) / total};
}
inline Slice my_slice(int64_t n, int salt = 0) {
  return uneven_slice(n, rank(), size(), salt);
}
inline Slice even_slice_of(int64_t n) {
  return distributed::even_slice(n, rank(), size());
}

/// Rows [s.begin, s.end) along N of a [B, H, N, X] tensor (a copy).
inline Tensor rows(const Tensor& t, Slice s) {
  const Shape4& sh = t.shape();
  Tensor out({sh[0], sh[1], s.size(), sh[3]});
  for (int64_t bh = 0; bh < sh[0] * sh[1]; ++bh) {
    std::copy_n(t.data() + (bh * sh[2] + s.begin) * sh[3], s.size() * sh[3],
                out.data() + bh * s.size() * sh[3]);
  }
  return out;
}

/// Columns [s.begin, s.end) of a [B, N] mask.
inline std::vector<uint8_t> mask_rows(const std::vector<uint8_t>& mask, int64_t batch, int64_t n,
                                      Slice s) {
  std::vector<uint8_t> out;
  for (int64_t b = 0; b < batch; ++b)
    out.insert(out.end(), mask.begin() + b * n + s.begin, mask.begin() + b * n + s.end);
  return out;
}

// Tolerance. The distributed and the single-process results are float32 evaluations of the
// same sums in different orders: the per-slice key states are summed rank by rank and
// combined with rescaling factors exp(max_r - max) rounded to float, and the causal chunks
// start at other positions. Each state entry then differs by a few units of float rounding
// (u = 6e-8) per term of its sum relative to the sum of the terms' magnitudes, N <= 100 terms:
// ~1e-5; the trig and hyperbolic features take both signs and cancel, so the bound is taken
// relative to the largest magnitude of the whole result rather than entry by entry. 2e-4
// leaves a margin of ~10 above that, while a wrong slice, offset or stabiliser gives errors
// of order 1.
constexpr double kTolerance = 2e-4;

inline double max_abs(const float* x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(double(x[i])));
  return m;
}

/// The largest |got - want| over the largest |want| (want: the full reference's slice s).
inline double slice_error(const Tensor& want_full, Slice s, const Tensor& got) {
  const Tensor want = rows(want_full, s);
  EXPECT_EQ(want.shape(), got.shape());
  double diff = 0.0;
  for (int64_t i = 0; i < std::min(want.numel(), got.numel()); ++i)
    diff = std::max(diff, std::abs(double(got.data()[i]) - want.data()[i]));
  return diff / std::max(max_abs(want_full.data(), want_full.numel()), 1e-30);
}

inline double vector_error(const std::vector<float>& want, const std::vector<float>& got) {
  EXPECT_EQ(want.size(), got.size());
  double diff = 0.0;
  for (size_t i = 0; i < std::min(want.size(), got.size()); ++i)
    diff = std::max(diff, std::abs(double(got[i]) - want[i]));
  return diff / std::max(max_abs(want.data(), static_cast<int64_t>(want.size())), 1e-30);
}

/// Element-wise sums over every rank (parameter gradients are shares per rank).
inline std::vector<float> sum_over_ranks(std::vector<float> x) {
  MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  return x;
}
inline std::vector<double> sum_over_ranks(std::vector<double> x) {
  MPI_Allreduce(MPI_IN_PLACE, x.data(), static_cast<int>(x.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return x;
}

/// The full problem every rank builds: q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv],
/// dy [B, H, Nq, Dv], and a key mask [B, Nk] (key j of batch b out when (j + b) % 5 == 3).
struct Problem {
  int64_t batch = 2, heads = 2, nq = 45, nk = 45, d = 8, dv = 5;
  Tensor q, k, v, dy;
  std::vector<uint8_t> mask;

  Problem(int64_t nq_, int64_t nk_, uint64_t seed = 11) : nq(nq_), nk(nk_) {
    // Row norms around 1.2 after the 1/sqrt(D) temperature: softmax weights that vary.
    q = testing::random_tensor({batch, heads, nq, d}, seed, 2.0);
    k = testing::random_tensor({batch, heads, nk, d}, seed + 1, 2.0);
    v = testing::random_tensor({batch, heads, nk, dv}, seed + 2);
    dy = testing::random_tensor({batch, heads, nq, dv}, seed + 3);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t j = 0; j < nk; ++j) mask.push_back((j + b) % 5 != 3);
  }
};

/// This rank's slices of a Problem.
struct Local {
  Slice qs, ks;
  Tensor q, k, v, dy;
  std::vector<uint8_t> mask;
  Local(const Problem& p, Slice qs_, Slice ks_)
      : qs(qs_),
        ks(ks_),
        q(rows(p.q, qs_)),
        k(rows(p.k, ks_)),
        v(rows(p.v, ks_)),
        dy(rows(p.dy, qs_)),
        mask(mask_rows(p.mask, p.batch, p.nk, ks_)) {}
  KeyMaskView mask_view() const {
    return KeyMaskView::contiguous(mask.data(), q.shape()[0], ks.size());
  }
  Tensor empty_out() const { return Tensor({q.shape()[0], q.shape()[1], qs.size(), v.shape()[3]}); }
};

}  // namespace favor::mpitest
