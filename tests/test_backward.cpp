// Gradients. (1) The materialised reference gradient (double) equals central finite
// differences of the double forward to 1e-6 (FAVOR++ / FAVOR#: dW through W itself, the fit
// held fixed). (2) The fast float32 kernels equal the reference within twice the error of a
// naive float32 evaluation of the same gradient (+1e-6). (3) Exact attention's blockwise
// backward equals the naive softmax gradient. (4) FAVOR gradients approach the exact ones
// like 1/sqrt(m).
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <optional>
#include <string>

#include "core/rng.hpp"
#include "gradient_check.hpp"
#include "reference/naive.hpp"
#include "reference/naive_grad.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_backward {
namespace {
using testing::fd_error_float;
using testing::random_tensor;
using testing::rel_error;
namespace naive = reference::naive;

// ---- (1) finite differences ----

naive::Head<double> random_head(int64_t nq, int64_t nk, int64_t d, int64_t dv, int64_t m,
                                double norm, uint64_t seed) {
  detail::Rng rng(seed, 7);
  naive::Head<double> h{nq, nk, d, dv, m, {}, {}, {}, {}, {}};
  auto fill = [&](std::vector<double>& x, int64_t n, double s) {
    for (int64_t i = 0; i < n; ++i) x.push_back(s * rng.normal());
  };
  fill(h.q, nq * d, norm / std::sqrt(double(d)));
  fill(h.k, nk * d, norm / std::sqrt(double(d)));
  fill(h.v, nk * dv, 1.0);
  fill(h.w, m * d, 1.0);
  return h;
}

double loss(const naive::Head<double>& h, const std::vector<double>& dy, Kernel kernel,
            double scale, bool causal) {
  const auto y = naive::forward(h, kernel, scale, causal);
  double l = 0;
  for (size_t i = 0; i < y.size(); ++i) l += dy[i] * y[i];
  return l;
}

// || fd - analytic || / || analytic || over one parameter array.
double fd_error(naive::Head<double> h, std::vector<double> naive::Head<double>::* field,
                const std::vector<double>& analytic, const std::vector<double>& dy, Kernel kernel,
                double scale, bool causal) {
  const double step = 1e-5;
  std::vector<double> fd((h.*field).size());
  for (size_t i = 0; i < (h.*field).size(); ++i) {
    const double saved = (h.*field)[i];
    (h.*field)[i] = saved + step;
    const double up = loss(h, dy, kernel, scale, causal);
    (h.*field)[i] = saved - step;
    const double down = loss(h, dy, kernel, scale, causal);
    (h.*field)[i] = saved;
    fd[i] = (up - down) / (2 * step);
  }
  return testing::gradient_error(fd, analytic);
}

struct FdCase {
  Kernel kernel;
  bool causal, masked;
};

class GradientVsFiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(GradientVsFiniteDifferences, RelativeErrorBelow1e6) {
  const FdCase c = GetParam();
  // D != Dv; N = 7 is not a multiple of anything; scale 0.6 (not 1/sqrt(D)).
  const int64_t nk = 7, nq = c.causal ? 7 : 5;
  naive::Head<double> h = random_head(nq, nk, 3, 2, c.kernel == Kernel::trig ? 24 : 6, 0.8, 11);
  if (c.masked) h.mask = {1, 0, 1, 1, 0, 1, 1};
  const std::vector<double> dy = random_head(nq, 1, 2, 1, 1, 1.0, 5).q;
  const double scale = 0.6;
  const auto g = naive::backward(h, dy, c.kernel, scale, c.causal);
  // Central differences with step 1e-5: truncation ~1e-10 and rounding ~1e-11 relative.
  EXPECT_LE(fd_error(h, &naive::Head<double>::q, g.dq, dy, c.kernel, scale, c.causal), 1e-6)
      << "dq";
  EXPECT_LE(fd_error(h, &naive::Head<double>::k, g.dk, dy, c.kernel, scale, c.causal), 1e-6)
      << "dk";
  EXPECT_LE(fd_error(h, &naive::Head<double>::v, g.dv, dy, c.kernel, scale, c.causal), 1e-6)
      << "dv";
  EXPECT_LE(fd_error(h, &naive::Head<double>::w, g.dw, dy, c.kernel, scale, c.causal), 1e-6)
      << "dW";
}

std::vector<FdCase> fd_cases() {
  std::vector<FdCase> out;
  for (Kernel k : {Kernel::positive, Kernel::hyperbolic, Kernel::trig})
    for (bool causal : {false, true})
      for (bool masked : {false, true}) out.push_back({k, causal, masked});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, GradientVsFiniteDifferences, ::testing::ValuesIn(fd_cases()),
                         [](const auto& info) {
                           return to_string(info.param.kernel) +
                                  (info.param.causal ? "_causal" : "_bidir") +
                                  (info.param.masked ? "_masked" : "");
                         });

// FAVOR++ / FAVOR#: the public reference, whose W_h, b_h and constant come from the fit and
// W (naive::head_map), differentiated numerically through W itself (Projection::from_matrix)
// and through q, k, v, with the fit held fixed.

// The fits of the tests: per (batch, head) from calibration rows, or one shared by every
// head (FAVOR#: rotated, with an A > 0; FAVOR++: one constant A > 0).
enum class FitKind { none, self, shared, per_head };

std::string fit_name(FitKind f) {
  switch (f) {
    case FitKind::none:
      return "";
    case FitKind::self:
      return "_selffit";
    case FitKind::shared:
      return "_sharedfit";
    case FitKind::per_head:
      return "_headfit";
  }
  return "";
}

std::optional<KernelFit> test_fit(Kernel kernel, FitKind f, int64_t B, int64_t H, int64_t D,
                                  std::optional<double> scale) {
  if (f == FitKind::none || f == FitKind::self) return std::nullopt;
  if (f == FitKind::per_head) {
    return fit_kernel(kernel, random_tensor({B, H, 24, D}, 21, 1.2),
                      random_tensor({B, H, 24, D}, 22, 1.2), scale);
  }
  if (kernel == Kernel::favorpp) return KernelFit::constant(0.08, D);
  KernelFit fit = fit_kernel(kernel, random_tensor({1, 1, 24, D}, 23, 1.2),
                             random_tensor({1, 1, 24, D}, 24, 1.2), scale);
  for (int64_t l = 0; l < D; ++l) fit.a[l] = l % 3 == 0 ? 0.1 : l % 3 == 1 ? -0.3 : -0.02;
  return fit;
}

struct AdaptedFdCase {
  Kernel kernel;
  bool causal, masked;
  FitKind fit;
};

class AdaptedGradientVsFiniteDifferences : public ::testing::TestWithParam<AdaptedFdCase> {};

TEST_P(AdaptedGradientVsFiniteDifferences, RelativeErrorBelow1e6) {
  const AdaptedFdCase c = GetParam();
  // B*H = 2 (a per-head fit differs from a shared one); D = 3 != Dv = 2; N = 7; scale 0.6.
  const int64_t B = 1, H = 2, nk = 7, nq = c.causal ? 7 : 5, D = 3, Dv = 2, m = 6;
  Tensor q = random_tensor({B, H, nq, D}, 1, 0.8), k = random_tensor({B, H, nk, D}, 2, 0.8),
         v = random_tensor({B, H, nk, Dv}, 3);
  const Tensor dy = random_tensor({B, H, nq, Dv}, 4);
  std::vector<float> w = Projection::draw(m, D, {ProjectionKind::iid, NormMode::chi, 5}).matrix();
  const std::vector<uint8_t> mask{1, 0, 1, 1, 0, 1, 1};
  AttentionOptions o;
  o.kernel = c.kernel;
  o.causal = c.causal;
  o.scale = 0.6;
  o.fit = test_fit(c.kernel, c.fit, B, H, D, o.scale);
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), B, nk);
  const auto loss = [&] {
    return testing::output_loss(
        dy, reference::favor_attention(q, k, v, Projection::from_matrix(m, D, w), o).values);
  };
  const auto g =
      reference::favor_attention_backward(q, k, v, dy, Projection::from_matrix(m, D, w), o);
  // As for the fixed kernels: truncation ~1e-10 and rounding ~1e-11 relative.
  EXPECT_LE(fd_error_float(q.values(), g.dq.values, loss), 1e-6) << "dq";
  EXPECT_LE(fd_error_float(k.values(), g.dk.values, loss), 1e-6) << "dk";
  EXPECT_LE(fd_error_float(v.values(), g.dv.values, loss), 1e-6) << "dv";
  const double dw_error = fd_error_float(w, g.dw, loss);
  EXPECT_LE(dw_error, 1e-6) << "dW";
  std::cout << "[ dW vs finite differences ] relative error " << dw_error << "\n";
}

std::vector<AdaptedFdCase> adapted_fd_cases() {
  std::vector<AdaptedFdCase> out;
  for (Kernel k : {Kernel::favorpp, Kernel::favorsharp})
    for (bool causal : {false, true})
      for (bool masked : {false, true})
        for (FitKind f : {FitKind::shared, FitKind::per_head})
          out.push_back({k, causal, masked, f});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Adapted, AdaptedGradientVsFiniteDifferences,
                         ::testing::ValuesIn(adapted_fd_cases()), [](const auto& info) {
                           return to_string(info.param.kernel) +
                                  (info.param.causal ? "_causal" : "_bidir") +
                                  (info.param.masked ? "_masked" : "") + fit_name(info.param.fit);
                         });

// ---- (2) fast kernels against the reference ----

struct Case {
  int64_t B, H, Nq, Nk, D, Dv, m;
  Kernel kernel;
  bool causal, masked, strided;
  FitKind fit = FitKind::none;  // FAVOR++ / FAVOR#
};

std::string name_of(const Case& c) {
  return to_string(c.kernel) + (c.causal ? "_causal" : "_bidir") + (c.masked ? "_masked" : "") +
         (c.strided ? "_strided" : "") + "_N" + std::to_string(c.Nq) + "x" + std::to_string(c.Nk) +
         "_D" + std::to_string(c.D) + "_Dv" + std::to_string(c.Dv) + "_m" + std::to_string(c.m) +
         fit_name(c.fit);
}

// The naive float32 gradient of every head, flattened like the tensors; FAVOR++ / FAVOR#
// through the head map (built in double and rounded, as the fast path does) and its adjoint
// in float.
struct FlatGrads {
  std::vector<float> dq, dk, dv, dw;
};

FlatGrads naive_float_grads(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dy,
                            const Projection& w, const std::vector<uint8_t>& mask,
                            const std::optional<KernelFit>& fit, const Case& c) {
  FlatGrads out;
  out.dw.assign(static_cast<size_t>(w.m() * w.d()), 0.0f);
  auto rows = [](const Tensor& t, int64_t b, int64_t h) {
    const int64_t n = t.shape()[2] * t.shape()[3];
    return std::vector<float>(t.data() + (b * t.shape()[1] + h) * n,
                              t.data() + (b * t.shape()[1] + h + 1) * n);
  };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const naive::HeadMap map = naive::head_map(w, c.kernel, fit, b * c.H + h);
      naive::Head<float> head{c.Nq,          c.Nk,          c.D,           c.Dv, c.m,
                              rows(q, b, h), rows(k, b, h), rows(v, b, h), {},   {}};
      head.w.assign(map.w.begin(), map.w.end());
      if (data_adapted(c.kernel)) head.bias.assign(map.bias.begin(), map.bias.end());
      if (c.masked) head.mask.assign(mask.begin() + b * c.Nk, mask.begin() + (b + 1) * c.Nk);
      const auto g = naive::backward(head, rows(dy, b, h), c.kernel,
                                     float(1.0 / std::sqrt(double(c.D))), c.causal);
      out.dq.insert(out.dq.end(), g.dq.begin(), g.dq.end());
      out.dk.insert(out.dk.end(), g.dk.begin(), g.dk.end());
      out.dv.insert(out.dv.end(), g.dv.begin(), g.dv.end());
      naive::head_map_backward(w, c.kernel, fit, b * c.H + h, g.dw, g.dbias, out.dw);
    }
  return out;
}

class BackwardVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  const testing::BackwardInputs in(c.B, c.H, c.Nq, c.Nk, c.D, c.Dv, c.masked);
  const Tensor &q = in.q, &k = in.k, &v = in.v, &dy = in.dy;
  const Projection w = Projection::draw(c.m, c.D, {ProjectionKind::orthogonal, NormMode::chi, 7});
  AttentionOptions o;
  o.kernel = c.kernel;
  o.causal = c.causal;
  o.fit = test_fit(c.kernel, c.fit, c.B, c.H, c.D, std::nullopt);
  o.key_mask = in.key_mask();
  const AttentionGrads fast = in.fast_backward(w, o, c.strided);
  const auto ref = reference::favor_attention_backward(q, k, v, dy, w, o);
  const double scale = 1.0 / std::sqrt(double(c.D));
  const FlatGrads n32 =
      naive_float_grads(q, k, v, dy, w, in.mask, naive::attention_fit(q, k, o, scale), c);
  const auto check = [&](const std::vector<float>& got, const std::vector<float>& naive,
                         const std::vector<double>& exact, const char* what) {
    const testing::GradientComparison r = testing::expect_within_twice_naive(
        got, naive, exact, std::string(what) + " of " + name_of(c));
    if (!r.zero && data_adapted(c.kernel) && std::string(what) == "dW") {
      std::cout << "[ dW fast vs reference ] relative error " << r.error << ", naive float32 "
                << r.naive_error << "\n";
    }
  };
  check(fast.dq.values(), n32.dq, ref.dq.values, "dq");
  check(fast.dk.values(), n32.dk, ref.dk.values, "dk");
  check(fast.dv.values(), n32.dv, ref.dv.values, "dv");
  check(fast.dw, n32.dw, ref.dw, "dW");
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Kernel kernel : {Kernel::positive, Kernel::hyperbolic, Kernel::trig}) {
    for (bool causal : {false, true}) {
      // Tails of the causal chunk (32) and the row tile (256); D != Dv; masks; strides.
      out.push_back({2, 3, 70, causal ? 70 : 45, 12, 5, 24, kernel, causal, false, false});
      out.push_back({1, 2, 33, 33, 8, 8, 16, kernel, causal, true, true});
      out.push_back({1, 1, 300, 300, 6, 9, 17, kernel, causal, true, false});
      out.push_back({1, 1, 1, 1, 4, 3, 8, kernel, causal, false, false});
    }
    // Causal sweeps project 256 tokens at a time (kProjectBlock): three blocks, the last
    // partial, forward from the start and in reverse from the end.
    out.push_back({1, 2, 600, 600, 6, 9, 17, kernel, true, true, false});
  }
  // FAVOR++ / FAVOR#: per-head fits (dW_h per head) and shared ones (dW_h summed over heads,
  // with per-thread partials), the same tails; bidirectional calls also fit themselves.
  for (Kernel kernel : {Kernel::favorpp, Kernel::favorsharp}) {
    for (bool causal : {false, true}) {
      const int64_t nk = causal ? 70 : 45;
      out.push_back({2, 3, 70, nk, 12, 5, 24, kernel, causal, false, false, FitKind::per_head});
      out.push_back({2, 3, 70, nk, 12, 5, 24, kernel, causal, true, false, FitKind::shared});
      out.push_back({2, 2, 33, 33, 8, 8, 16, kernel, causal, true, true, FitKind::per_head});
      out.push_back({1, 1, 300, 300, 6, 9, 17, kernel, causal, true, false, FitKind::shared});
      out.push_back({1, 1, 1, 1, 4, 3, 8, kernel, causal, false, false, FitKind::per_head});
    }
    out.push_back({2, 2, 65, 40, 8, 5, 16, kernel, false, true, false, FitKind::self});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kernels, BackwardVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

// ---- (3) exact attention ----

TEST(ExactBackward, MatchesNaiveDoubleGradient) {
  for (bool causal : {false, true}) {
    for (bool masked : {false, true}) {
      const Tensor q = random_tensor({2, 2, 150, 12}, 5, 3.0),
                   k = random_tensor({2, 2, 150, 12}, 6, 3.0), v = random_tensor({2, 2, 150, 7}, 7),
                   dy = random_tensor({2, 2, 150, 7}, 8);
      std::vector<uint8_t> mask(300, 1);
      ExactOptions o;
      o.causal = causal;
      if (masked) {
        mask = testing::periodic_mask(mask.size(), 5, 2);
        o.key_mask = KeyMaskView::contiguous(mask.data(), 2, 150);
      }
      const AttentionGrads g = exact_attention_backward(q, k, v, dy, o);
      const auto ref = reference::exact_attention_backward(q, k, v, dy, o);
      // float32 scores (|s| <= 9 with norms <= 4.5) carry ~D 2^-24 |s| ~ 6e-6 relative error,
      // which exp turns into the same relative error of P; sums over 150 keys add ~sqrt(150)
      // 2^-24. dS = P (dP - D) subtracts nearly equal terms: bound 1e-4.
      EXPECT_LE(rel_error(g.dq, ref.dq.values), 1e-4) << causal << masked;
      EXPECT_LE(rel_error(g.dk, ref.dk.values), 1e-4) << causal << masked;
      EXPECT_LE(rel_error(g.dv, ref.dv.values), 1e-5) << causal << masked;
    }
  }
}

// ---- (4) FAVOR gradients approach the exact ones ----

TEST(Backward, ApproachesExactGradientsAsMGrows) {
  // Like the outputs, the gradients' error against exact attention falls like 1/sqrt(m):
  // averaged over 6 seeds, m = 64 -> 4096 should cut it ~8x; require a ratio in [4, 16].
  const Tensor q = random_tensor({1, 2, 48, 16}, 31, 2.0),
               k = random_tensor({1, 2, 64, 16}, 32, 2.0), v = random_tensor({1, 2, 64, 8}, 33),
               dy = random_tensor({1, 2, 48, 8}, 34);
  const auto exact = reference::exact_attention_backward(q, k, v, dy, {});
  for (const char* which : {"dq", "dk", "dv"}) {
    double small = 0, large = 0;
    for (uint64_t seed = 0; seed < 6; ++seed) {
      const auto g64 = favor_attention_backward(
          q, k, v, dy, Projection::draw(64, 16, {ProjectionKind::iid, NormMode::chi, seed}));
      const auto g4k = favor_attention_backward(
          q, k, v, dy, Projection::draw(4096, 16, {ProjectionKind::iid, NormMode::chi, seed}));
      const auto pick = [&](const AttentionGrads& g) -> const Tensor& {
        return which[1] == 'q' ? g.dq : which[1] == 'k' ? g.dk : g.dv;
      };
      const auto& ref = which[1] == 'q' ? exact.dq : which[1] == 'k' ? exact.dk : exact.dv;
      small += rel_error(pick(g64), ref.values) / 6;
      large += rel_error(pick(g4k), ref.values) / 6;
    }
    std::cout << "[ favor vs exact gradient ] " << which << ": relative error m=64 " << small
              << ", m=4096 " << large << ", ratio " << small / large << "\n";
    EXPECT_GE(small / large, 4.0) << which << ": " << small << " -> " << large;
    EXPECT_LE(small / large, 16.0) << which << ": " << small << " -> " << large;
  }
}

TEST(Backward, NoVisibleKeyPassesNoGradient) {
  const Tensor q = random_tensor({1, 1, 40, 4}, 1, 1.0), k = random_tensor({1, 1, 40, 4}, 2, 1.0),
               v = random_tensor({1, 1, 40, 3}, 3), dy = random_tensor({1, 1, 40, 3}, 4);
  std::vector<uint8_t> mask(40, 1);
  for (int j = 0; j < 5; ++j) mask[j] = 0;
  mask[20] = 0;
  AttentionOptions o;
  o.causal = true;
  o.key_mask = KeyMaskView::contiguous(mask.data(), 1, 40);
  const AttentionGrads g = favor_attention_backward(q, k, v, dy, Projection::draw(16, 4), o);
  for (int64_t i = 0; i < 5; ++i)  // queries 0..4 see no key; keys 0..4 and 20 are masked
    for (int64_t t = 0; t < 4; ++t) EXPECT_EQ(g.dq.at(0, 0, i, t), 0.0f);
  for (int64_t j : {0, 3, 20}) {
    for (int64_t t = 0; t < 4; ++t) EXPECT_EQ(g.dk.at(0, 0, j, t), 0.0f);
    for (int64_t t = 0; t < 3; ++t) EXPECT_EQ(g.dv.at(0, 0, j, t), 0.0f);
  }
  EXPECT_NE(g.dq.at(0, 0, 5, 0), 0.0f);
}

TEST(Backward, Errors) {
  const Tensor q = random_tensor({1, 1, 4, 4}, 1), k = random_tensor({1, 1, 4, 4}, 2),
               v = random_tensor({1, 1, 4, 3}, 3);
  Tensor dy = random_tensor({1, 1, 4, 2}, 4);
  try {
    favor_attention_backward(q, k, v, dy, Projection::draw(8, 4));
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dy: shape [1,1,4,2] must be the output's shape"),
              std::string::npos)
        << e.what();
  }
  Tensor dy2 = random_tensor({1, 1, 4, 3}, 4);
  dy2.at(0, 0, 2, 1) = NAN;
  EXPECT_THROW(favor_attention_backward(q, k, v, dy2, Projection::draw(8, 4)), Error);
  EXPECT_THROW(exact_attention_backward(q, k, v, dy2), Error);
}

}  // namespace
}  // namespace favor::test_backward

namespace favor::test_backward {
namespace {

TEST(Backward, SavedContextGivesTheSameGradients) {
  for (int64_t heads : {int64_t{1}, int64_t{4}}) {  // one head: the forward splits it over threads
    const Tensor q = testing::random_tensor({1, heads, 90, 8}, 1, 1.5),
                 k = testing::random_tensor({1, heads, 110, 8}, 2, 1.5),
                 v = testing::random_tensor({1, heads, 110, 5}, 3),
                 dy = testing::random_tensor({1, heads, 90, 5}, 4);
    const Projection w = Projection::draw(24, 8, {ProjectionKind::orthogonal, NormMode::chi, 3});
    std::vector<uint8_t> mask(110);
    mask = testing::periodic_mask(mask.size(), 4, 1);
    for (Kernel kernel : {Kernel::positive, Kernel::trig}) {
      AttentionOptions o;
      o.kernel = kernel;
      o.key_mask = KeyMaskView::contiguous(mask.data(), 1, 110);
      Tensor y({1, heads, 90, 5});
      AttentionContext ctx;
      favor_attention(q, k, v, w, y.mutable_view(), o, &ctx);
      ASSERT_TRUE(ctx.valid());
      const AttentionGrads with = favor_attention_backward(q, k, v, dy, w, o, true, &ctx);
      const AttentionGrads without = favor_attention_backward(q, k, v, dy, w, o, true);
      // The saved state is the forward's (possibly merged from parts): equal up to the
      // summation order of the state.
      EXPECT_LE(relative_frobenius_error(with.dq, without.dq), 1e-6);
      EXPECT_LE(relative_frobenius_error(with.dk, without.dk), 1e-6);
      EXPECT_LE(relative_frobenius_error(with.dv, without.dv), 1e-6);
    }
  }
}

TEST(Backward, StaleOrCausalContextIsRefused) {
  const Tensor q = testing::random_tensor({1, 2, 20, 4}, 1),
               k = testing::random_tensor({1, 2, 20, 4}, 2),
               v = testing::random_tensor({1, 2, 20, 3}, 3),
               dy = testing::random_tensor({1, 2, 20, 3}, 4);
  const Projection w = Projection::draw(8, 4);
  Tensor y({1, 2, 20, 3});
  AttentionContext ctx;
  favor_attention(q, k, v, w, y.mutable_view(), {}, &ctx);
  Tensor v2 = v;
  v2.at(0, 1, 7, 2) += 1.0f;
  EXPECT_THROW(favor_attention_backward(q, k, v2, dy, w, {}, false, &ctx), Error);
  EXPECT_THROW(favor_attention_backward(
                   q, k, v, dy, Projection::draw(8, 4, {ProjectionKind::iid, NormMode::chi, 1}), {},
                   false, &ctx),
               Error);
  AttentionOptions causal;
  causal.causal = true;
  AttentionContext causal_ctx;
  favor_attention(q, k, v, w, y.mutable_view(), causal, &causal_ctx);
  EXPECT_FALSE(causal_ctx.valid());
  EXPECT_THROW(favor_attention_backward(q, k, v, dy, w, causal, false, &causal_ctx), Error);
  EXPECT_NO_THROW(favor_attention_backward(q, k, v, dy, w, {}, false, &ctx));
  // A causal context (save_causal_states) covers q too: its rows are q's [num | den].
  causal.save_causal_states = true;
  favor_attention(q, k, v, w, y.mutable_view(), causal, &causal_ctx);
  ASSERT_TRUE(causal_ctx.valid());
  Tensor q2 = q;
  q2.at(0, 0, 3, 1) += 1.0f;
  EXPECT_THROW(favor_attention_backward(q2, k, v, dy, w, causal, false, &causal_ctx), Error);
  EXPECT_THROW(favor_attention_backward(q, k, v, dy, w, {}, false, &causal_ctx), Error);
  EXPECT_NO_THROW(favor_attention_backward(q, k, v, dy, w, causal, false, &causal_ctx));
  // The same context held elsewhere (AttentionContextView over copies of its arrays, as a
  // framework's tensors hold it): the same gradients bit for bit, and the same checks.
  const std::vector<float> states = causal_ctx.states, rows = causal_ctx.rows;
  const std::vector<double> maxima = causal_ctx.maxima;
  AttentionContextView borrowed = causal_ctx.view();  // sizes and fingerprint; then the copies
  borrowed.states = states.data();
  borrowed.maxima = maxima.data();
  borrowed.rows = rows.data();
  const AttentionGrads owned = favor_attention_backward(q, k, v, dy, w, causal, false, &causal_ctx);
  const AttentionGrads viewed = favor_attention_backward(q, k, v, dy, w, causal, false, borrowed);
  EXPECT_EQ(viewed.dq.values(), owned.dq.values());
  EXPECT_EQ(viewed.dk.values(), owned.dk.values());
  EXPECT_EQ(viewed.dv.values(), owned.dv.values());
  EXPECT_THROW(favor_attention_backward(q2, k, v, dy, w, causal, false, borrowed), Error);
  borrowed.rows_size -= 1;  // a short array: refused, never read past its end
  EXPECT_THROW(favor_attention_backward(q, k, v, dy, w, causal, false, borrowed), Error);
}

// The causal context: one reverse sweep from the forward's chunk states and rows gives the
// gradients of the two recomputing sweeps, up to the summation order of dW (per chunk
// instead of all queries, then all keys). N = 100: three full 32-token chunks and a partial
// one; N = 600: three blocks of projections (kProjectBlock = 256), the last partial; one
// head: the forward splits it over threads (segment states).
TEST(Backward, SavedCausalStatesGiveTheSameGradients) {
  for (auto [heads, n] : {std::pair<int64_t, int64_t>{1, 100}, {3, 100}, {1, 600}, {2, 600}}) {
    const Tensor q = testing::random_tensor({1, heads, n, 8}, 1, 1.5),
                 k = testing::random_tensor({1, heads, n, 8}, 2, 1.5),
                 v = testing::random_tensor({1, heads, n, 5}, 3),
                 dy = testing::random_tensor({1, heads, n, 5}, 4);
    const Projection w = Projection::draw(24, 8, {ProjectionKind::orthogonal, NormMode::chi, 3});
    std::vector<uint8_t> mask = testing::periodic_mask(n, 4, 1);
    AttentionContext ctx;  // reused: its buffers are resized (F = m, 2m, m), not reallocated
    for (Kernel kernel : {Kernel::positive, Kernel::trig, Kernel::favorsharp}) {
      AttentionOptions o;
      o.kernel = kernel;
      o.causal = true;
      o.save_causal_states = true;
      o.key_mask = KeyMaskView::contiguous(mask.data(), 1, n);
      if (data_adapted(kernel)) o.fit = fit_kernel(kernel, q, k);
      Tensor y({1, heads, n, 5}), y_plain({1, heads, n, 5});
      favor_attention(q, k, v, w, y.mutable_view(), o, &ctx);
      ASSERT_TRUE(ctx.valid());
      favor_attention(q, k, v, w, y_plain.mutable_view(), o);
      EXPECT_EQ(y.values(), y_plain.values());  // saving changes nothing in the output
      const AttentionGrads with = favor_attention_backward(q, k, v, dy, w, o, true, &ctx);
      const AttentionGrads without = favor_attention_backward(q, k, v, dy, w, o, true);
      EXPECT_LE(relative_frobenius_error(with.dq, without.dq), 1e-6)
          << to_string(kernel) << " N = " << n;
      EXPECT_LE(relative_frobenius_error(with.dk, without.dk), 1e-6)
          << to_string(kernel) << " N = " << n;
      EXPECT_LE(relative_frobenius_error(with.dv, without.dv), 1e-6)
          << to_string(kernel) << " N = " << n;
      EXPECT_LE(relative_frobenius_error(Tensor({1, 1, 1, int64_t(with.dw.size())}, with.dw),
                                         Tensor({1, 1, 1, int64_t(without.dw.size())}, without.dw)),
                1e-6);
    }
  }
}

}  // namespace
}  // namespace favor::test_backward
