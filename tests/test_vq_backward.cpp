// Gradients of Transformer-VQ attention. (1) The double reference equals central finite
// differences of a small double forward written here (hard VQ: w.r.t. the quantised keys,
// the codebook through them; soft VQ: w.r.t. k and C through p(s|k)); hard dk equals the
// exact-attention gradient w.r.t. the quantised keys. (2) The float kernels equal the
// reference within twice the error of a naive float32 evaluation of the same formula
// (reference/naive_vq.hpp in float). (3) Causal results do not depend on the block
// length; thread counts give bit-identical results. (4) Heads whose codes take the direct
// route, the moment route, or both (hard VQ's key gradient) are as accurate. (5) dy is
// validated.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "reference/naive_vq.hpp"
#include "test_helpers.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_vq_backward {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::rel_error;
using testing::ThreadCount;

// ---- (1) the reference against finite differences ----

// || a - b || / || b ||.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

struct Inputs {
  int64_t nq, nk, d, dv, c;
  std::vector<double> q, k, v, C, dy, khat;  // khat: quantised keys (hard VQ), or empty
  std::vector<uint8_t> mask;
};

std::vector<double> to_double(const Tensor& t) {
  return std::vector<double>(t.values().begin(), t.values().end());
}

// L = sum_i dy_i . y_i, y_i = sum_j w_ij v_j / sum_j w_ij over the visible keys, with
// w_ij = exp(scale q_i.khat_j) (hard, khat given, else khat_j = C_{argmin_s |k_j - C_s|}) or
// sum_s exp(scale q_i.C_s) softmax_s(-|k_j - C_s|^2 / tau) (soft).
double loss(const Inputs& in, double scale, double tau, bool causal) {
  auto dot = [](const double* a, const double* b, int64_t n) {
    double s = 0;
    for (int64_t t = 0; t < n; ++t) s += a[t] * b[t];
    return s;
  };
  auto dist2 = [&](int64_t j, int64_t s) {
    double e = 0;
    for (int64_t t = 0; t < in.d; ++t)
      e += (in.k[j * in.d + t] - in.C[s * in.d + t]) * (in.k[j * in.d + t] - in.C[s * in.d + t]);
    return e;
  };
  double l = 0;
  for (int64_t i = 0; i < in.nq; ++i) {
    std::vector<double> y(static_cast<size_t>(in.dv), 0.0);
    double den = 0;
    for (int64_t j = 0; j < in.nk; ++j) {
      if ((causal && j > i) || (!in.mask.empty() && !in.mask[j])) continue;
      double w = 0;
      if (tau == 0.0) {
        const double* key = nullptr;
        if (!in.khat.empty()) {
          key = in.khat.data() + j * in.d;
        } else {
          int64_t best = 0;
          for (int64_t s = 1; s < in.c; ++s)
            if (dist2(j, s) < dist2(j, best)) best = s;
          key = in.C.data() + best * in.d;
        }
        w = std::exp(scale * dot(in.q.data() + i * in.d, key, in.d));
      } else {
        double z = 0;
        for (int64_t s = 0; s < in.c; ++s) z += std::exp(-dist2(j, s) / tau);
        for (int64_t s = 0; s < in.c; ++s)
          w += std::exp(scale * dot(in.q.data() + i * in.d, in.C.data() + s * in.d, in.d)) *
               std::exp(-dist2(j, s) / tau) / z;
      }
      den += w;
      for (int64_t x = 0; x < in.dv; ++x) y[x] += w * in.v[j * in.dv + x];
    }
    if (den > 0) l += dot(in.dy.data() + i * in.dv, y.data(), in.dv) / den;
  }
  return l;
}

// || fd - analytic || / || analytic || over one input array.
double fd_error(Inputs in, std::vector<double> Inputs::*field, const std::vector<double>& analytic,
                double scale, double tau, bool causal) {
  const double step = 1e-5;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < (in.*field).size(); ++i) {
    const double saved = (in.*field)[i];
    (in.*field)[i] = saved + step;
    const double up = loss(in, scale, tau, causal);
    (in.*field)[i] = saved - step;
    const double down = loss(in, scale, tau, causal);
    (in.*field)[i] = saved;
    const double fd = (up - down) / (2 * step);
    diff += (fd - analytic[i]) * (fd - analytic[i]);
    norm += analytic[i] * analytic[i];
  }
  return std::sqrt(diff / norm);
}

struct FdCase {
  bool soft, causal, masked;
};

class VQBackwardFiniteDifferences : public ::testing::TestWithParam<FdCase> {};

TEST_P(VQBackwardFiniteDifferences, ReferenceWithin1e6) {
  const FdCase fc = GetParam();
  // D = 3 != Dv = 2; N = 7; c = 4 codes; scale 0.6 (not 1/sqrt(D)); tau 0.7.
  const int64_t nk = 7, nq = fc.causal ? 7 : 5, D = 3, Dv = 2, c = 4;
  const double scale = 0.6, tau = fc.soft ? 0.7 : 0.0;
  const Tensor q = random_tensor({1, 1, nq, D}, 11, 1.5), k = random_tensor({1, 1, nk, D}, 12, 1.0),
               v = random_tensor({1, 1, nk, Dv}, 13), dy = random_tensor({1, 1, nq, Dv}, 14),
               C = random_tensor({1, 1, c, D}, 15, 1.0);
  const std::vector<uint8_t> mask{1, 0, 1, 1, 0, 1, 1};
  VQOptions o;
  o.causal = fc.causal;
  o.scale = scale;
  o.tau = tau;
  if (fc.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), 1, nk);
  const auto g = reference::vq_attention_backward(q, k, v, dy, C, o);
  Inputs in{nq,
            nk,
            D,
            Dv,
            c,
            to_double(q),
            to_double(k),
            to_double(v),
            to_double(C),
            to_double(dy),
            {},
            fc.masked ? mask : std::vector<uint8_t>{}};
  // Truncation ~ step^2 = 1e-10 and rounding ~ 1e-16 / step = 1e-11, relative: 1e-6 is loose.
  EXPECT_LE(fd_error(in, &Inputs::q, g.dq.values, scale, tau, fc.causal), 1e-6) << "dq";
  EXPECT_LE(fd_error(in, &Inputs::v, g.dv.values, scale, tau, fc.causal), 1e-6) << "dv";
  EXPECT_LE(fd_error(in, &Inputs::C, g.dw, scale, tau, fc.causal), 1e-6) << "dC";
  if (fc.soft) {
    EXPECT_LE(fd_error(in, &Inputs::k, g.dk.values, scale, tau, fc.causal), 1e-6) << "dk";
    return;
  }
  // Hard: dk is dL/dk^, the gradient of softmax attention over the quantised keys.
  const auto z = reference::vq_naive::nearest(in.k, nk, D, in.C, c);
  Tensor khat({1, 1, nk, D});
  for (int64_t j = 0; j < nk; ++j)
    for (int64_t t = 0; t < D; ++t) khat.at(0, 0, j, t) = C.at(0, 0, z[j], t);
  in.khat = to_double(khat);
  EXPECT_LE(fd_error(in, &Inputs::khat, g.dk.values, scale, tau, fc.causal), 1e-6) << "dk^";
  ExactOptions eo;
  eo.causal = fc.causal;
  eo.scale = scale;
  eo.key_mask = o.key_mask;
  const auto exact = reference::exact_attention_backward(q, khat, v, dy, eo);
  // Same sums in another order: double rounding.
  EXPECT_LE(rel_diff(g.dk.values, exact.dk.values), 1e-12)
      << "dk vs exact_attention_backward over the quantised keys";
}

INSTANTIATE_TEST_SUITE_P(VQBackward, VQBackwardFiniteDifferences,
                         ::testing::Values(FdCase{false, false, false}, FdCase{false, true, false},
                                           FdCase{false, false, true}, FdCase{false, true, true},
                                           FdCase{true, false, false}, FdCase{true, true, false},
                                           FdCase{true, false, true}, FdCase{true, true, true}),
                         [](const auto& info) {
                           return std::string(info.param.soft ? "soft" : "hard") +
                                  (info.param.causal ? "_causal" : "_bidir") +
                                  (info.param.masked ? "_masked" : "");
                         });

// ---- (2) the float kernels against the reference ----

struct Case {
  int64_t B, H, Nq, Nk, D, Dv, c;
  bool soft, causal, masked, shared, strided;
  int64_t block = 0;
};

std::string name_of(const Case& c) {
  return std::string(c.soft ? "soft" : "hard") + (c.causal ? "_causal" : "_bidir") +
         (c.masked ? "_masked" : "") + (c.shared ? "_shared" : "") + (c.strided ? "_strided" : "") +
         "_N" + std::to_string(c.Nq) + "x" + std::to_string(c.Nk) + "_D" + std::to_string(c.D) +
         "_Dv" + std::to_string(c.Dv) + "_c" + std::to_string(c.c) + "_L" + std::to_string(c.block);
}

struct Problem {
  Tensor q, k, v, dy, C;
  std::vector<uint8_t> mask;
  VQOptions o;
};

Problem make_problem(const Case& c) {
  Problem pr{random_tensor({c.B, c.H, c.Nq, c.D}, 21, 2.0),
             random_tensor({c.B, c.H, c.Nk, c.D}, 22, 2.0),
             random_tensor({c.B, c.H, c.Nk, c.Dv}, 23),
             random_tensor({c.B, c.H, c.Nq, c.Dv}, 24),
             random_tensor({1, c.shared ? 1 : c.H, c.c, c.D}, 25, 2.0),
             std::vector<uint8_t>(static_cast<size_t>(c.B * c.Nk), 1),
             {}};
  pr.o.causal = c.causal;
  pr.o.tau = c.soft ? 1.0 : 0.0;
  pr.o.block = c.block;
  if (c.masked) {
    pr.mask = testing::periodic_mask(pr.mask.size(), 3, 1);
    pr.o.key_mask = KeyMaskView::contiguous(pr.mask.data(), c.B, c.Nk);
  }
  return pr;
}

struct FlatGrads {
  std::vector<float> dq, dk, dv, dc;
};

// The naive float32 gradient of every head (codes from the double argmin, as the
// reference's), flattened like the tensors; dC summed over heads in float.
FlatGrads naive_float_grads(const Problem& pr, const Case& c) {
  namespace vq_naive = reference::vq_naive;
  FlatGrads out;
  out.dc.assign(static_cast<size_t>(pr.C.numel()), 0.0f);
  const float scale = float(1.0 / std::sqrt(double(c.D)));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t hc = c.shared ? 0 : h;
      const auto head = vq_naive::head_of<float>(pr.q, pr.k, pr.v, pr.C, pr.o, b, h);
      const auto g = vq_naive::backward(head, reference::naive::head_rows<float>(pr.dy, b, h),
                                        scale, c.causal);
      out.dq.insert(out.dq.end(), g.dq.begin(), g.dq.end());
      out.dk.insert(out.dk.end(), g.dk.begin(), g.dk.end());
      out.dv.insert(out.dv.end(), g.dv.begin(), g.dv.end());
      for (size_t i = 0; i < g.dc.size(); ++i) out.dc[hc * c.c * c.D + i] += g.dc[i];
    }
  return out;
}

VQGrads fast_grads(const Problem& pr, const Case& c) {
  if (!c.strided) return vq_attention_backward(pr.q, pr.k, pr.v, pr.dy, pr.C, pr.o, true);
  testing::StridedCopy qs(pr.q), ks(pr.k), vs(pr.v), dys(pr.dy);
  return vq_attention_backward(qs.view, ks.view, vs.view, dys.view, pr.C, pr.o, true);
}

// Relative error of `got` within twice the naive float32 error (+1e-6 for gradients that are
// tiny sums of cancelling terms).
void expect_close(const std::vector<float>& got, const std::vector<float>& naive,
                  const std::vector<double>& exact, const std::string& what) {
  double exact_max = 0, got_max = 0;
  for (double e : exact) exact_max = std::max(exact_max, std::abs(e));
  for (float g : got) got_max = std::max(got_max, double(std::abs(g)));
  if (exact_max < 1e-10) {  // zero up to double rounding
    // One code (soft VQ: p = 1): y_i is the mean of the visible v whatever q, k and C, so dq,
    // dk and dC are exactly 0; the kernels' values are cancellations of O(|v| |dy|) terms
    // summed over <= 20 rows of |q| <= 3: rounding ~ 20 * 3 * 2^-24 * few ~ 1e-5.
    EXPECT_LE(got_max, 1e-5) << what;
    return;
  }
  const double naive_err = rel_error(naive, exact), err = rel_error(got, exact);
  EXPECT_LE(err, 2 * naive_err + 1e-6) << what << ", naive " << naive_err;
}

class VQBackwardVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(VQBackwardVsReference, WithinTwiceNaiveFloatError) {
  const Case c = GetParam();
  const Problem pr = make_problem(c);
  const VQGrads fast = fast_grads(pr, c);
  const auto ref = reference::vq_attention_backward(pr.q, pr.k, pr.v, pr.dy, pr.C, pr.o);
  const FlatGrads n32 = naive_float_grads(pr, c);
  const std::string name = name_of(c);
  expect_close(fast.dq.values(), n32.dq, ref.dq.values, "dq of " + name);
  expect_close(fast.dk.values(), n32.dk, ref.dk.values, "dk of " + name);
  expect_close(fast.dv.values(), n32.dv, ref.dv.values, "dv of " + name);
  expect_close(fast.dcodebook.values(), n32.dc, ref.dw, "dC of " + name);
  ASSERT_EQ(fast.dcodebook.shape(), pr.C.shape());
  if (c.masked) {  // masked keys: exactly zero dk and dv
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t j = 1; j < c.Nk; j += 3) {
          for (int64_t t = 0; t < c.D; ++t) EXPECT_EQ(fast.dk.at(b, h, j, t), 0.0f) << name;
          for (int64_t x = 0; x < c.Dv; ++x) EXPECT_EQ(fast.dv.at(b, h, j, x), 0.0f) << name;
        }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (bool soft : {false, true})
    for (bool causal : {false, true}) {
      const int64_t n = causal ? 45 : 37;
      out.push_back({2, 2, n, 45, 8, 5, 16, soft, causal, false, false, false, 16});
      out.push_back({2, 2, n, 45, 8, 5, 16, soft, causal, true, true, false, 16});
      out.push_back({1, 3, n, 45, 6, 7, 5, soft, causal, true, false, true, 7});
      // Tails of the default tile / block (128); one code.
      out.push_back({1, 1, causal ? 130 : 129, 130, 4, 3, 9, soft, causal, false, false, false});
      out.push_back({1, 2, 9, 9, 4, 3, 1, soft, causal, true, true, false, 4});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(VQBackward, VQBackwardVsReference, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

// ---- (3) block length and thread count ----

TEST(VQBackwardCausal, BlockLengthDoesNotChangeTheResult) {
  for (bool soft : {false, true}) {
    const Case base{1, 2, 40, 40, 6, 5, 8, soft, true, true, false, false, 40};
    const Problem whole = make_problem(base);
    const VQGrads ref_fast = fast_grads(whole, base);
    const auto ref =
        reference::vq_attention_backward(whole.q, whole.k, whole.v, whole.dy, whole.C, whole.o);
    const FlatGrads n32 = naive_float_grads(whole, base);
    for (int64_t L : {1, 7, 64}) {
      Case c = base;
      c.block = L;
      const Problem pr = make_problem(c);
      const VQGrads g = fast_grads(pr, c);
      const std::string name = name_of(c);
      expect_close(g.dq.values(), n32.dq, ref.dq.values, "dq of " + name);
      expect_close(g.dk.values(), n32.dk, ref.dk.values, "dk of " + name);
      expect_close(g.dv.values(), n32.dv, ref.dv.values, "dv of " + name);
      expect_close(g.dcodebook.values(), n32.dc, ref.dw, "dC of " + name);
      // Each within 2x the naive error of the reference, so within 4x of each other.
      const auto against_whole = [&](const Tensor& a, const Tensor& b, const std::vector<float>& n,
                                     const std::vector<double>& e, const char* what) {
        EXPECT_LE(rel_error(a, std::vector<double>(b.values().begin(), b.values().end())),
                  4 * rel_error(n, e) + 1e-6)
            << what << " of " << name << " vs L = N";
      };
      against_whole(g.dq, ref_fast.dq, n32.dq, ref.dq.values, "dq");
      against_whole(g.dk, ref_fast.dk, n32.dk, ref.dk.values, "dk");
      against_whole(g.dv, ref_fast.dv, n32.dv, ref.dv.values, "dv");
      against_whole(g.dcodebook, ref_fast.dcodebook, n32.dc, ref.dw, "dC");
    }
  }
}

TEST(VQBackwardThreads, OneAndTwoThreadsGiveIdenticalResults) {
  ThreadCount restore;
  for (bool causal : {false, true})
    for (bool soft : {false, true}) {
      const Case c{2, 2, 33, 33, 6, 5, 8, soft, causal, true, true, false, 8};
      const Problem pr = make_problem(c);
      set_num_threads(1);
      const VQGrads one = fast_grads(pr, c);
      set_num_threads(2);
      const VQGrads two = fast_grads(pr, c);
      EXPECT_EQ(one.dq.values(), two.dq.values()) << name_of(c);
      EXPECT_EQ(one.dk.values(), two.dk.values()) << name_of(c);
      EXPECT_EQ(one.dv.values(), two.dv.values()) << name_of(c);
      EXPECT_EQ(one.dcodebook.values(), two.dcodebook.values()) << name_of(c);
    }
}

// ---- (4) the two routes of hard VQ's key gradient (cpu/vq_key_routes.hpp) ----
// A code with n_s visible keys in the head goes direct when n_s (D + Dv) < D Dv, else through
// the per-code moments; with D = 4, Dv = 6: direct for n_s <= 2. The keys sit next to their
// codes (noise 0.02 against codes of norm 2), so many per code as asked, interleaved over the
// sequence (the direct keys of the causal kernel then lie in several blocks).

enum class Routes { kMixed, kAllDirect, kAllMoments };

struct RouteCase {
  std::string name;
  std::vector<int64_t> counts;  // keys per code; c = counts.size()
  Routes routes;                // what the visible counts must exercise in every head
  bool causal, masked;
};

constexpr int64_t kRouteD = 4, kRouteDv = 6;
constexpr int64_t kRouteMax = (kRouteD * kRouteDv - 1) / (kRouteD + kRouteDv);  // 2

Problem make_routed_problem(const RouteCase& rc, Case& c) {
  int64_t n = 0;
  for (int64_t k : rc.counts) n += k;
  c = Case{1,     2,         n,         n,     kRouteD, kRouteDv, int64_t(rc.counts.size()),
           false, rc.causal, rc.masked, false, false,   7};
  Problem pr = make_problem(c);
  std::vector<int32_t> code;
  for (size_t s = 0; s < rc.counts.size(); ++s)
    code.insert(code.end(), size_t(rc.counts[s]), int32_t(s));
  const Tensor noise = random_tensor(pr.k.shape(), 26);
  for (int64_t h = 0; h < c.H; ++h)
    for (int64_t j = 0; j < n;
         ++j)  // j -> 7 j mod n: a permutation (no n below is a multiple of 7)
      for (int64_t t = 0; t < c.D; ++t)
        pr.k.at(0, h, j, t) = pr.C.at(0, h, code[(j * 7) % n], t) + 0.02f * noise.at(0, h, j, t);
  return pr;
}

void PrintTo(const RouteCase& rc, std::ostream* os) {
  *os << rc.name;
}

class VQBackwardKeyRoutes : public ::testing::TestWithParam<RouteCase> {};

TEST_P(VQBackwardKeyRoutes, WithinTwiceNaiveFloatError) {
  const RouteCase rc = GetParam();
  Case c;
  Problem pr = make_routed_problem(rc, c);
  ASSERT_NE(c.Nk % 7, 0);
  // The routes the kernels take: from the visible keys of each code, the codes as the
  // reference assigns them.
  const auto z = reference::naive::nearest_codes(pr.k, pr.C);
  for (int64_t h = 0; h < c.H; ++h) {
    std::vector<int64_t> visible(size_t(c.c), 0);
    for (int64_t j = 0; j < c.Nk; ++j)
      if (!c.masked || pr.mask[size_t(j)]) ++visible[size_t(z[size_t(h * c.Nk + j)])];
    int direct = 0, moments = 0;
    for (int64_t n_s : visible) {
      direct += n_s > 0 && n_s <= kRouteMax;
      moments += n_s > kRouteMax;
    }
    if (rc.routes != Routes::kAllMoments) EXPECT_GT(direct, 0) << rc.name << " head " << h;
    if (rc.routes != Routes::kAllDirect) EXPECT_GT(moments, 0) << rc.name << " head " << h;
    if (rc.routes == Routes::kAllDirect) EXPECT_EQ(moments, 0) << rc.name << " head " << h;
    if (rc.routes == Routes::kAllMoments) EXPECT_EQ(direct, 0) << rc.name << " head " << h;
  }
  const auto ref = reference::vq_attention_backward(pr.q, pr.k, pr.v, pr.dy, pr.C, pr.o);
  const FlatGrads n32 = naive_float_grads(pr, c);
  // Causal: blocks of 1 (every direct pair across blocks), 7 and N (none across blocks).
  for (int64_t L : rc.causal ? std::vector<int64_t>{1, 7, c.Nq} : std::vector<int64_t>{0}) {
    pr.o.block = L;
    const VQGrads fast = fast_grads(pr, c);
    const std::string name = rc.name + "_L" + std::to_string(L);
    expect_close(fast.dq.values(), n32.dq, ref.dq.values, "dq of " + name);
    expect_close(fast.dk.values(), n32.dk, ref.dk.values, "dk of " + name);
    expect_close(fast.dv.values(), n32.dv, ref.dv.values, "dv of " + name);
    expect_close(fast.dcodebook.values(), n32.dc, ref.dw, "dC of " + name);
    for (int64_t h = 0; h < c.H && c.masked; ++h)  // masked keys: exactly zero dk
      for (int64_t j = 1; j < c.Nk; j += 3)
        for (int64_t t = 0; t < c.D; ++t) EXPECT_EQ(fast.dk.at(0, h, j, t), 0.0f) << name;
  }
}

std::vector<RouteCase> route_cases() {
  std::vector<RouteCase> out;
  const std::vector<std::pair<std::string, std::vector<int64_t>>> counts{
      {"mixed", {1, 2, 2, 3, 5, 7}},             // N = 20
      {"all_direct", {1, 2, 2, 1, 2, 2}},        // N = 10
      {"all_moments", {9, 10, 11, 12, 9, 10}}};  // N = 61
  const Routes routes[] = {Routes::kMixed, Routes::kAllDirect, Routes::kAllMoments};
  for (size_t k = 0; k < counts.size(); ++k)
    for (bool causal : {false, true})
      for (bool masked : {false, true})
        out.push_back(
            {counts[k].first + (causal ? "_causal" : "_bidir") + (masked ? "_masked" : ""),
             counts[k].second, routes[k], causal, masked});
  return out;
}

INSTANTIATE_TEST_SUITE_P(VQBackward, VQBackwardKeyRoutes, ::testing::ValuesIn(route_cases()),
                         [](const auto& info) { return info.param.name; });

// ---- (5) errors ----

TEST(VQBackwardErrors, DyShapeAndValuesAreChecked) {
  const Case c{1, 2, 5, 6, 4, 3, 4, false, false, false, false, false};
  const Problem pr = make_problem(c);
  const Tensor wrong = random_tensor({1, 2, 5, 4}, 1);  // Dv = 4, not 3
  expect_error([&] { vq_attention_backward(pr.q, pr.k, pr.v, wrong, pr.C, pr.o); }, "dy: shape");
  Tensor nan = pr.dy;
  nan.at(0, 1, 2, 0) = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { vq_attention_backward(pr.q, pr.k, pr.v, nan, pr.C, pr.o); }, "dy");
  expect_error([&] { reference::vq_attention_backward(pr.q, pr.k, pr.v, wrong, pr.C, pr.o); },
               "dy: shape");
}

}  // namespace
}  // namespace favor::test_vq_backward
