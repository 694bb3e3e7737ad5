// Sequence-parallel attention (favor/sequence_parallel.hpp) with P = 1..4 ranks played by
// threads (tests/thread_exchange.hpp): every rank's slice of the output and of dq, dk, dv, and
// the parameter gradients summed over ranks, equal single-process favor_attention on the whole
// sequence, for both directions, every kernel, learned maps, masks, decay, uneven and empty
// slices and cross attention; bad input on one rank, or ranks that disagree, throw on every
// rank. Rerun with ./favor_tests --gtest_filter='SequenceParallel*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "map_fixture.hpp"
#include "slice_helpers.hpp"
#include "test_helpers.hpp"
#include "thread_exchange.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_sequence_parallel {
namespace {
using testing::bounds_of;
using testing::max_abs;
using testing::max_diff;
using testing::random_tensor;
using testing::rows_of;

struct Case {
  std::string name;
  Kernel kernel = Kernel::positive;
  bool causal = false;
  bool masked = false;
  std::vector<double> decay;
  testing::MapSpec spec;
  bool fit_given = false;  // FAVOR++ / FAVOR#: a fit from calibration data
  int64_t nq = 300, nk = 300;
  // One (batch, head) on 4 favor threads: every rank's kernels split the head (bidirectional
  // parts merged after a barrier; causal segments chained) and must start from the state the
  // other ranks sent.
  bool split_heads = false;
  std::vector<int> weights;  // slice weights, one per rank
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// The tolerance: the split only reorders float sums and rescales states by exp(max - max')
// (each a few ulps); 2e-4 of the largest magnitude leaves room for the longest sums (N = 300,
// F = 128) while a wrong state (a missing or doubled rank, a wrong stabiliser) is off by O(1).
constexpr double kTolerance = 2e-4;

class SequenceParallel : public ::testing::TestWithParam<Case> {};

TEST_P(SequenceParallel, EqualsTheWholeSequence) {
  const Case c = GetParam();
  const int64_t B = c.split_heads ? 1 : 2, H = c.split_heads ? 1 : 2, D = 16, Dv = 8, m = 64;
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(c.split_heads ? 4 : 1);
  const Tensor q = random_tensor({B, H, c.nq, D}, 11, 2.0);
  const Tensor k = random_tensor({B, H, c.nk, D}, 12, 2.0);
  const Tensor v = random_tensor({B, H, c.nk, Dv}, 13);
  const Tensor dy = random_tensor({B, H, c.nq, Dv}, 14);
  ProjectionOptions po;
  po.seed = 5;
  FeatureMap map = testing::random_map(c.kernel, Projection::draw(m, D, po), c.spec, 21);
  if (c.fit_given)
    map.fit = fit_kernel(c.kernel, random_tensor({1, 1, 64, D}, 31, 2.0),
                         random_tensor({1, 1, 64, D}, 32, 2.0));
  std::vector<uint8_t> mask = testing::periodic_mask(static_cast<size_t>(B * c.nk), 5, 2);
  AttentionOptions o;
  o.causal = c.causal;
  o.decay = c.decay;
  if (c.masked) o.key_mask = KeyMaskView::contiguous(mask.data(), B, c.nk);
  const bool grads = true;  // dW (or the map's parameters) and ddecay, summed over ranks below
  const Tensor whole = favor_attention(q, k, v, map, o);
  const AttentionGrads g = favor_attention_backward(q, k, v, dy, map, o, grads);
  const double scale_out = max_abs(whole.values()), scale_dq = max_abs(g.dq.values()),
               scale_dk = max_abs(g.dk.values()), scale_dv = max_abs(g.dv.values());

  const int P = static_cast<int>(c.weights.size());
  const std::vector<int64_t> qb = bounds_of(c.nq, c.weights), kb = bounds_of(c.nk, c.weights);
  std::mutex lock;
  std::vector<float> dw(g.dw.size(), 0.0f), dbias(g.dbias.size(), 0.0f),
      dlambda(g.dlambda.size(), 0.0f);
  std::vector<double> ddecay(g.ddecay.size(), 0.0);
  std::vector<std::string> failures(static_cast<size_t>(P));
  std::vector<int64_t> offsets(static_cast<size_t>(P));
  testing::run_ranks(P, [&](testing::ThreadExchange& ex) {
    const int r = ex.rank();
    const Tensor qs = rows_of(q, qb[r], qb[r + 1]), ks = rows_of(k, kb[r], kb[r + 1]),
                 vs = rows_of(v, kb[r], kb[r + 1]), dys = rows_of(dy, qb[r], qb[r + 1]);
    std::vector<uint8_t> mask_s;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = kb[r]; j < kb[r + 1]; ++j) mask_s.push_back(mask[b * c.nk + j]);
    AttentionOptions os = o;
    if (c.masked) os.key_mask = KeyMaskView::contiguous(mask_s.data(), B, kb[r + 1] - kb[r]);
    Tensor out({B, H, qb[r + 1] - qb[r], Dv});
    try {
      const SequenceParallelStats st =
          sequence_parallel_attention(qs, ks, vs, map, out.mutable_view(), os, ex);
      offsets[r] = st.offset;
      const AttentionGrads gs =
          sequence_parallel_attention_backward(qs, ks, vs, dys, map, os, ex, grads);
      std::string f;
      const double eo = max_diff(out, whole, qb[r]) / scale_out;
      const double eq = max_diff(gs.dq, g.dq, qb[r]) / scale_dq;
      const double ek = max_diff(gs.dk, g.dk, kb[r]) / scale_dk;
      const double ev = max_diff(gs.dv, g.dv, kb[r]) / scale_dv;
      if (!(eo <= kTolerance)) f += " out " + std::to_string(eo);
      if (!(eq <= kTolerance)) f += " dq " + std::to_string(eq);
      if (!(ek <= kTolerance)) f += " dk " + std::to_string(ek);
      if (!(ev <= kTolerance)) f += " dv " + std::to_string(ev);
      failures[r] = f;
      std::lock_guard<std::mutex> guard(lock);
      for (size_t i = 0; i < gs.dw.size(); ++i) dw[i] += gs.dw[i];
      for (size_t i = 0; i < gs.dbias.size(); ++i) dbias[i] += gs.dbias[i];
      for (size_t i = 0; i < gs.dlambda.size(); ++i) dlambda[i] += gs.dlambda[i];
      for (size_t i = 0; i < gs.ddecay.size(); ++i) ddecay[i] += gs.ddecay[i];
    } catch (const std::exception& e) {
      failures[r] = std::string(" threw: ") + e.what();
    }
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(failures[r], "") << "rank " << r << " of " << P;
    EXPECT_EQ(offsets[r], kb[r]) << "rank " << r;
  }
  auto expect_sum = [](const std::vector<float>& got, const std::vector<float>& want,
                       const char* what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    const double scale = std::max(max_abs(want), 1e-30);
    for (size_t i = 0; i < want.size(); ++i)
      ASSERT_LE(std::abs(double(got[i]) - want[i]) / scale, kTolerance) << what << "[" << i << "]";
  };
  expect_sum(dw, g.dw, "dw summed over ranks");
  expect_sum(dbias, g.dbias, "dbias summed over ranks");
  expect_sum(dlambda, g.dlambda, "dlambda summed over ranks");
  ASSERT_EQ(ddecay.size(), g.ddecay.size());
  for (size_t i = 0; i < ddecay.size(); ++i)
    EXPECT_NEAR(ddecay[i], g.ddecay[i], kTolerance * std::max(1.0, std::abs(g.ddecay[i])))
        << "ddecay[" << i << "] summed over ranks";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const std::vector<std::vector<int>> splits = {{1}, {1, 1}, {3, 1, 2}, {2, 0, 3, 1}};
  for (bool causal : {false, true}) {
    for (const auto& w : splits) {
      const std::string p = "_P" + std::to_string(w.size());
      const std::string dir = causal ? "causal" : "bidirectional";
      Case c;
      c.causal = causal;
      c.weights = w;
      c.name = dir + "_positive" + p;
      out.push_back(c);
      Case masked = c;
      masked.masked = true;
      masked.name = dir + "_positive_masked" + p;
      out.push_back(masked);
      for (Kernel kn : {Kernel::trig, Kernel::hyperbolic, Kernel::favorpp, Kernel::favorsharp}) {
        Case e = c;
        e.kernel = kn;
        e.fit_given = causal && data_adapted(kn);
        e.name = dir + "_" + to_string(kn) + p;
        out.push_back(e);
      }
      Case learned = c;
      learned.kernel = Kernel::hedgehog;
      learned.spec = {2, true, true, true};
      learned.name = dir + "_hedgehog_learned" + p;
      out.push_back(learned);
      Case split = c;
      split.split_heads = true;
      split.masked = true;
      split.nq = split.nk = 700;  // segments of whole chunks on every rank
      split.name = dir + "_split_heads_masked" + p;
      out.push_back(split);
      Case wpff = c;
      wpff.spec = {1, false, false, true};
      wpff.masked = true;
      wpff.name = dir + "_positive_lambda_masked" + p;
      out.push_back(wpff);
      if (causal) {
        Case decay = c;
        decay.decay = {0.97, 0.9};
        decay.masked = true;
        decay.name = dir + "_decay_masked" + p;
        out.push_back(decay);
      } else {
        Case cross = c;
        cross.nk = 170;
        cross.name = dir + "_cross" + p;
        out.push_back(cross);
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Split, SequenceParallel, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Runs the forward call on P ranks where `tweak` may change a rank's inputs; returns every
// rank's error message ("" when it did not throw).
std::vector<std::string> errors_of(
    int P, const std::function<void(int, Tensor&, AttentionOptions&, Projection&)>& tweak) {
  std::vector<std::string> errors(static_cast<size_t>(P));
  testing::run_ranks(P, [&](testing::ThreadExchange& ex) {
    const int r = ex.rank();
    Tensor q = random_tensor({1, 2, 10 + r, 8}, 1), k = random_tensor({1, 2, 10 + r, 8}, 2),
           v = random_tensor({1, 2, 10 + r, 4}, 3);
    AttentionOptions o;
    ProjectionOptions po;
    Projection w = Projection::draw(16, 8, po);
    tweak(r, q, o, w);
    Tensor out({1, 2, q.shape()[2], 4});
    try {
      sequence_parallel_attention(q, k, v, w, out.mutable_view(), o, ex);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

TEST(SequenceParallelErrors, ABadSliceOnOneRankStopsEveryRank) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  const auto errors = errors_of(3, [](int r, Tensor& q, AttentionOptions&, Projection&) {
    if (r == 1) q = random_tensor({1, 2, 11, 6}, 1);  // D = 6 against k's 8
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("rank 1: "), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("head dim D"), std::string::npos) << errors[r];
  }
}

TEST(SequenceParallelErrors, NonFiniteInputOnOneRankStopsEveryRank) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  const auto errors = errors_of(2, [](int r, Tensor& q, AttentionOptions&, Projection&) {
    if (r == 1) q.values()[5] = std::nanf("");
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("rank 1: q: element"), std::string::npos);
}

TEST(SequenceParallelErrors, RanksThatDisagreeStopEveryRank) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  const auto causal = errors_of(3, [](int r, Tensor& q, AttentionOptions& o, Projection&) {
    if (r == 2) {
      o.causal = true;
      q = random_tensor({1, 2, 12, 8}, 1);  // causal needs Nq == Nk: valid on its own
    }
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(causal[r].find("disagree on the causal"), std::string::npos) << causal[r];
  const auto seed = errors_of(2, [](int r, Tensor&, AttentionOptions&, Projection& w) {
    ProjectionOptions po;
    po.seed = 9;
    if (r == 0) w = Projection::draw(16, 8, po);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(seed[r].find("disagree on the feature map"), std::string::npos) << seed[r];
  const auto features = errors_of(2, [](int r, Tensor&, AttentionOptions&, Projection& w) {
    ProjectionOptions po;
    if (r == 1) w = Projection::draw(32, 8, po);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(features[r].find("disagree on the features F (rank 0: 16, rank 1: 32)"),
              std::string::npos)
        << features[r];
}

TEST(SequenceParallelErrors, AForwardBesideABackwardStopsEveryRank) {
  // A rank whose loss does not depend on the output skips the backward its peers run; its
  // next forward call then meets their backward: the calls send different collectives, so
  // they must be refused, not left waiting.
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  std::vector<std::string> errors(2);
  testing::run_ranks(2, [&](testing::ThreadExchange& ex) {
    const int r = ex.rank();
    const Tensor q = random_tensor({1, 2, 10, 8}, 1), k = random_tensor({1, 2, 10, 8}, 2),
                 v = random_tensor({1, 2, 10, 4}, 3), dy = random_tensor({1, 2, 10, 4}, 4);
    ProjectionOptions po;
    const Projection w = Projection::draw(16, 8, po);
    AttentionOptions o;
    o.causal = true;
    Tensor out({1, 2, 10, 4});
    try {
      if (r == 0) {
        sequence_parallel_attention(q, k, v, w, out.mutable_view(), o, ex);
      } else {
        sequence_parallel_attention_backward(q, k, v, dy, w, o, ex);
      }
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("disagree on the call (forward or backward)"), std::string::npos)
        << errors[r];
}

TEST(SequenceParallelStats, CommunicationDoesNotGrowWithN) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  std::vector<int64_t> bytes;
  for (int64_t n : {64, 4096}) {
    std::vector<int64_t> per_rank(2);
    testing::run_ranks(2, [&](testing::ThreadExchange& ex) {
      const Tensor q = random_tensor({1, 2, n, 8}, 1), k = random_tensor({1, 2, n, 8}, 2),
                   v = random_tensor({1, 2, n, 4}, 3);
      ProjectionOptions po;
      const Projection w = Projection::draw(16, 8, po);
      AttentionOptions o;
      o.causal = true;
      Tensor out({1, 2, n, 4});
      per_rank[ex.rank()] =
          sequence_parallel_attention(q, k, v, w, out.mutable_view(), o, ex).payload_bytes;
    });
    EXPECT_EQ(per_rank[0], per_rank[1]);
    bytes.push_back(per_rank[0]);
  }
  EXPECT_EQ(bytes[0], bytes[1]);
  // One record per (batch, head): a 32-byte header and F x (Dv + 1) floats.
  EXPECT_EQ(bytes[0], 2 * (32 + 16 * 5 * 4));
}

}  // namespace
}  // namespace favor::test_sequence_parallel
