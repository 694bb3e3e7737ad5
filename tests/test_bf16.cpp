// The bf16 forward (AttentionOptions::precision = bf16, src/cpu/favor_bidirectional_bf16.cpp):
// within the derived rounding bound of the float64 reference where it runs, and the fp32
// path bit for bit where it does not (no AVX512-BF16, FAVOR_NO_BF16, causal).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/bf16_features.hpp"
#include "favor/favor.hpp"
#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {

using testing::random_tensor;
using testing::rel_error;

// Sets FAVOR_NO_BF16 for the scope and restores what was there.
class NoBf16Scope {
 public:
  NoBf16Scope() {
    const char* old = std::getenv("FAVOR_NO_BF16");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("FAVOR_NO_BF16", "1", 1);
  }
  ~NoBf16Scope() {
    if (had_) {
      setenv("FAVOR_NO_BF16", old_.c_str(), 1);
    } else {
      unsetenv("FAVOR_NO_BF16");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.values() == b.values();
}

constexpr double kU = 1.0 / 256.0;         // bf16 unit roundoff
constexpr double kF32 = 1.0 / 16777216.0;  // float32 unit roundoff

float round_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

Tensor rounded(Tensor t) {
  for (float& x : t.values()) x = round_bf16(x);
  return t;
}

// Head h's projection (m x d): the map's learned weights of that head, or the projection.
const float* head_weights(const FeatureMap& map, int64_t h) {
  if (map.weights.empty()) return map.projection.data();
  return map.weights.data() + (map.heads == 1 ? 0 : h) * map.m() * map.d();
}

// Worst relative change of a feature of row x (head h; positive and hyperbolic features
// lambda^2 exp(+-a + const)): the projection a_f = sum_t W_ft x~_t (x~ = x D^(-1/4); a bias
// is added in fp32, unrounded) changes by at most e = (2u + u^2 [unless x~ and W are bf16
// already] + gamma_D) sum_t |W_ft x~_t|, the polynomial exp of cpu/bf16_features.hpp adds its
// error (FAVOR+; above fp32's few ulps for the other maps), the feature's own rounding u:
// eta = exp(e)(1 + exp error)(1 + u) - 1.
double feature_eta(const Tensor& x, int64_t h, int64_t row, const FeatureMap& map, bool exact) {
  const int64_t d = x.shape()[3];
  const float* w = head_weights(map, h);
  const double gamma = d * kF32 / (1.0 - d * kF32);
  const double rounding = exact ? 0.0 : 2.0 * kU + kU * kU;
  const double s = std::pow(double(d), -0.25);
  double worst = 0.0;
  for (int64_t f = 0; f < map.m(); ++f) {
    double sum = 0.0;
    for (int64_t t = 0; t < d; ++t)
      sum += std::abs(double(w[f * d + t]) * double(x.view().at(0, h, row, t))) * s;
    worst = std::max(worst, sum);
  }
  return std::exp((rounding + gamma) * worst) * (1.0 + cpu::kBf16ExpError) * (1.0 + kU) - 1.0;
}

// The bound of docs/numerics.md ("bf16 forward") on |y_bf16 - y|, element by element, as a
// relative Frobenius norm against the reference y. Each weight A_ij = sum_f phi_f(q_i)
// phi_f(k_j) > 0 becomes A_ij (1 + e_ij) with |e_ij| <= rho = (1 + eta_q)(1 + eta_K) - 1, which
// moves row i by at most rho / (1 - rho) E_A|v_c - y_ic| (E_A: the A-weighted mean over the
// visible keys); v and S rounded move the numerator alone, by at most
// ((1 + u)^2 - 1) E_A~|v_c| <= ((1 + u)^2 - 1) (1 + rho) / (1 - rho) E_A|v_c| (u alone when v
// is bf16 already).
// eta(x, h, row): the features' worst relative change (feature_eta); value_rounding: of the
// numerator alone.
template <class Eta>
double bf16_bound(const Tensor& q, const Tensor& k, const Tensor& v, const FeatureMap& map,
                  const std::vector<uint8_t>& visible, Eta eta, double value_rounding,
                  const reference::DTensor& ref) {
  const int64_t H = q.shape()[1], nq = q.shape()[2], nk = k.shape()[2], dv = v.shape()[3];
  const reference::DTensor pq = reference::features(q, map), pk = reference::features(k, map);
  const int64_t F = pq.shape[3];
  double total = 0.0, norm = 0.0;
  for (int64_t h = 0; h < H; ++h) {
    double eta_k = 0.0;
    for (int64_t j = 0; j < nk; ++j)
      if (visible[j]) eta_k = std::max(eta_k, eta(k, h, j));
    for (int64_t i = 0; i < nq; ++i) {
      const double rho = (1.0 + eta(q, h, i)) * (1.0 + eta_k) - 1.0;
      std::vector<double> a(static_cast<size_t>(nk), 0.0);
      double den = 0.0;
      for (int64_t j = 0; j < nk; ++j) {
        if (!visible[j]) continue;
        for (int64_t f = 0; f < F; ++f) a[j] += pq.at(0, h, i, f) * pk.at(0, h, j, f);
        den += a[j];
      }
      for (int64_t c = 0; c < dv; ++c) {
        const double y = ref.at(0, h, i, c);
        double spread = 0.0, size = 0.0;
        for (int64_t j = 0; j < nk; ++j) {
          const double vj = v.view().at(0, h, j, c);
          spread += a[j] * std::abs(vj - y);
          size += a[j] * std::abs(vj);
        }
        const double b = (rho * spread + value_rounding * (1.0 + rho) * size) / ((1.0 - rho) * den);
        total += b * b;
        norm += y * y;
      }
    }
  }
  return std::sqrt(total / norm);
}

// Exact inputs (only the features and S round): the first-order change of y under the
// standard probabilistic model of rounding (Higham & Mary 2019: the relative errors d of the
// roundings are independent, mean 0, |d| <= u so E d^2 <= u^2). With A_ij = sum_f
// phi_f(q_i) phi_f(k_j), D_i = sum_j A_ij, S_fc = sum_j phi_f(k_j) v_jc, s_f = sum_j phi_f(k_j):
//   dy_ic = sum_f phi_f(q_i) [(S_fc - y_ic s_f) dq_if + S_fc dS_fc] / D_i
//         + sum_f sum_j phi_f(q_i) phi_f(k_j) (v_jc - y_ic) dk_jf / D_i,
// so E|dy|^2 <= u^2 sum_ic sum_f phi_f(q_i)^2 [(S_fc - y s_f)^2 + S_fc^2 + P_fc - 2 y Q_fc
// + y^2 R_f] / D_i^2 with P_fc = sum_j phi_f(k_j)^2 v_jc^2, Q_fc = ... v_jc, R_f = ... 1
// (visible keys). Returns sqrt(E|dy|^2) / |y|.
double bf16_rms_exact(const Tensor& q, const Tensor& k, const Tensor& v, const FeatureMap& map,
                      const std::vector<uint8_t>& visible, const reference::DTensor& ref) {
  const int64_t H = q.shape()[1], nq = q.shape()[2], nk = k.shape()[2], dv = v.shape()[3];
  const reference::DTensor pq = reference::features(q, map), pk = reference::features(k, map);
  const int64_t F = pq.shape[3];
  double total = 0.0, norm = 0.0;
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> S(F * dv, 0.0), P(F * dv, 0.0), Q(F * dv, 0.0), s(F, 0.0), R(F, 0.0);
    for (int64_t j = 0; j < nk; ++j) {
      if (!visible[j]) continue;
      for (int64_t f = 0; f < F; ++f) {
        const double p = pk.at(0, h, j, f);
        s[f] += p;
        R[f] += p * p;
        for (int64_t c = 0; c < dv; ++c) {
          const double x = v.view().at(0, h, j, c);
          S[f * dv + c] += p * x;
          Q[f * dv + c] += p * p * x;
          P[f * dv + c] += p * p * x * x;
        }
      }
    }
    for (int64_t i = 0; i < nq; ++i) {
      double den = 0.0;
      for (int64_t f = 0; f < F; ++f) den += pq.at(0, h, i, f) * s[f];
      for (int64_t c = 0; c < dv; ++c) {
        const double y = ref.at(0, h, i, c);
        double var = 0.0;
        for (int64_t f = 0; f < F; ++f) {
          const double p2 = pq.at(0, h, i, f) * pq.at(0, h, i, f), Sf = S[f * dv + c];
          var += p2 * ((Sf - y * s[f]) * (Sf - y * s[f]) + Sf * Sf + P[f * dv + c] -
                       2.0 * y * Q[f * dv + c] + y * y * R[f]);
        }
        total += kU * kU * var / (den * den);
        norm += y * y;
      }
    }
  }
  return std::sqrt(total / norm);
}

enum class Inputs {
  exact,    // q, k, v, W bf16 numbers already, D = 16 (scale^1/2 = 1/2): only the features
            // and S round
  general,  // D = 64: everything rounds
  learned,  // D = 64, two heads with their own weights and bias (the fast FAVOR+ path)
  lambda,   // ... and feature weights (fp32 features, then rounded)
};

struct Bf16Case {
  Kernel kernel;
  bool masked;
  Inputs inputs;
  int threads;  // favor's threads for the call: 1 runs a head per task; 4 > B*H splits each
                // head's keys and queries into parts (partial states merged at one max)
};

// Sets favor's thread count for the scope.
class ThreadScope {
 public:
  explicit ThreadScope(int n) : saved_(num_threads()) { set_num_threads(n); }
  ~ThreadScope() { set_num_threads(saved_); }

 private:
  int saved_;
};

class Bf16Forward : public ::testing::TestWithParam<Bf16Case> {};

// N = 272 keys and queries: one full 256-row tile and a tail; m = 256; v with mean 1 (so
// that |y| is not a cancellation: the bound is relative to it).
TEST_P(Bf16Forward, WithinDerivedBoundOfReferenceOrFp32Fallback) {
  const Bf16Case c = GetParam();
  const bool exact = c.inputs == Inputs::exact, learned = c.inputs >= Inputs::learned;
  const int64_t H = learned ? 2 : 1, N = 272, D = exact ? 16 : 64, m = 256;
  const double norm = std::pow(double(D), 0.25);
  Tensor q = random_tensor({1, H, N, D}, 11, norm), k = random_tensor({1, H, N, D}, 12, norm);
  Tensor v = random_tensor({1, H, N, D}, 13);
  for (float& x : v.values()) x = 1.0f + 0.5f * x;
  Projection w = Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 5});
  if (exact) {
    q = rounded(std::move(q));
    k = rounded(std::move(k));
    v = rounded(std::move(v));
    std::vector<float> wv(w.data(), w.data() + m * D);
    for (float& x : wv) x = round_bf16(x);
    w = Projection::from_matrix(m, D, std::move(wv));
  }
  FeatureMap map(w, c.kernel);
  if (learned) {  // head 1: a second draw; a bias of +-0.5; lambda in [0.5, 1.5]
    map.learnable(H, true, true, c.inputs == Inputs::lambda);
    const Projection w1 = Projection::draw(m, D, {ProjectionKind::orthogonal, NormMode::chi, 6});
    std::copy(w1.data(), w1.data() + m * D, map.weights.begin() + m * D);
    const Tensor noise = random_tensor({1, 1, 2, H * m}, 14);
    for (int64_t i = 0; i < H * m; ++i) {
      map.bias[i] = 0.5f * std::tanh(noise.values()[i]);
      if (!map.lambda.empty()) map.lambda[i] = 1.0f + 0.5f * std::tanh(noise.values()[H * m + i]);
    }
  }
  std::vector<uint8_t> visible(N, 1);
  AttentionOptions o;
  if (c.masked) {
    visible = testing::periodic_mask(N, 4, 2);
    o.key_mask = KeyMaskView::contiguous(visible.data(), 1, N);
  }
  // Both calls on the same threads: with more threads than heads a head is split into parts
  // whose sums merge in another order, so the fp32 fallback is the fp32 call's bits only at
  // the same thread count (docs/api.md promises no more).
  Tensor f32, bf16;
  AttentionStats stats;
  {
    ThreadScope threads(c.threads);
    f32 = favor_attention(q, k, v, map, o);
    o.precision = Precision::bf16;
    bf16 = favor_attention(q, k, v, map, o, &stats);
  }
  if (!bf16_available()) {
    EXPECT_EQ(stats.precision, Precision::f32);
    EXPECT_TRUE(same_bits(bf16, f32));
    GTEST_SKIP() << "no bf16 here: checked the fp32 fallback only";
  }
  EXPECT_EQ(stats.precision, Precision::bf16);
  EXPECT_EQ(stats.zero_rows, 0);
  o.precision = Precision::f32;
  const auto ref = reference::favor_attention(q, k, v, map, o);
  const auto naive32 = reference::naive::favor_attention<float>(q, k, v, map, o);
  // The bf16 rounding bound, plus the fp32 arithmetic allowance of FavorVsReference.
  const double fp32 = 2.0 * rel_error(naive32, ref.values) + 1e-6;
  const double err = rel_error(bf16, ref.values);
  const auto worst = [&](const Tensor& x, int64_t h, int64_t row) {
    return feature_eta(x, h, row, map, exact);
  };
  const double value_rounding = exact ? kU : (1.0 + kU) * (1.0 + kU) - 1.0;
  EXPECT_LE(err, bf16_bound(q, k, v, map, visible, worst, value_rounding, ref) + fp32);
  if (exact) {  // and 5 standard deviations of the probabilistic model, plus the worst case of
                // the polynomial exp's error (systematic, not random) and fp32's
    const auto poly = [](const Tensor&, int64_t, int64_t) { return cpu::kBf16ExpError; };
    const double rms = bf16_rms_exact(q, k, v, map, visible, ref);
    EXPECT_LE(err, 5.0 * rms + bf16_bound(q, k, v, map, visible, poly, 0.0, ref) + fp32);
  }
  EXPECT_GT(err, rel_error(f32, ref.values));  // bf16 did round
}

INSTANTIATE_TEST_SUITE_P(Kernels, Bf16Forward,
                         ::testing::Values(Bf16Case{Kernel::positive, false, Inputs::exact, 1},
                                           Bf16Case{Kernel::positive, true, Inputs::exact, 4},
                                           Bf16Case{Kernel::hyperbolic, false, Inputs::exact, 4},
                                           Bf16Case{Kernel::positive, false, Inputs::general, 1},
                                           Bf16Case{Kernel::positive, false, Inputs::learned, 4},
                                           Bf16Case{Kernel::positive, true, Inputs::lambda, 1}));

TEST(Bf16Fallback, ForcedOffAndCausalRunFp32BitForBit) {
  const Tensor q = random_tensor({1, 2, 70, 16}, 21, 2.0);
  const Tensor k = random_tensor({1, 2, 70, 16}, 22, 2.0);
  const Tensor v = random_tensor({1, 2, 70, 8}, 23);
  const Projection w = Projection::draw(32, 16, {ProjectionKind::orthogonal, NormMode::chi, 3});
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const Tensor f32 = favor_attention(q, k, v, w, o);
    o.precision = Precision::bf16;
    AttentionStats stats;
    if (causal) {  // not implemented in bf16: the fp32 path
      const Tensor out = favor_attention(q, k, v, w, o, &stats);
      EXPECT_EQ(stats.precision, Precision::f32);
      EXPECT_TRUE(same_bits(out, f32));
      continue;
    }
    NoBf16Scope off;
    EXPECT_FALSE(bf16_available());
    const Tensor out = favor_attention(q, k, v, w, o, &stats);
    EXPECT_EQ(stats.precision, Precision::f32);
    EXPECT_TRUE(same_bits(out, f32));
  }
}

TEST(Bf16Fallback, BuildInfoSaysWhetherBf16Runs) {
  const std::string info = build_info();
  EXPECT_NE(info.find(bf16_available() ? "bf16 avx512-bf16" : "bf16 off"), std::string::npos)
      << info;
  NoBf16Scope off;
  EXPECT_NE(build_info().find("bf16 off (FAVOR_NO_BF16)"), std::string::npos);
}

}  // namespace
}  // namespace favor
