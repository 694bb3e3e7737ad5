// Results do not depend on the thread count: every way of splitting heads, key/query parts
// and causal segments over threads agrees with the reference (2x-naive rule) and with the
// one-thread result. Thread counts above the core count are fine (OpenMP oversubscribes).
#include <gtest/gtest.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>

#include "core/validate.hpp"
#include "cpu/team.hpp"
#include "reference/naive.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::random_tensor;
using testing::ThreadCount;

struct Split {
  int64_t B, H, N;
};

class ThreadSplits : public ::testing::TestWithParam<std::tuple<Split, bool>> {};

TEST_P(ThreadSplits, FavorAgreesAcrossThreadCounts) {
  const auto [split, causal] = GetParam();
  ThreadCount restore;
  const Tensor q = random_tensor({split.B, split.H, split.N, 16}, 1, 1.5),
               k = random_tensor({split.B, split.H, split.N, 16}, 2, 1.5),
               v = random_tensor({split.B, split.H, split.N, 8}, 3);
  const Projection w = Projection::draw(48, 16, {ProjectionKind::orthogonal, NormMode::chi, 4});
  std::vector<uint8_t> mask(static_cast<size_t>(split.B * split.N));
  mask = testing::periodic_mask(mask.size(), 7, 3);
  for (Kernel kernel : {Kernel::positive, Kernel::trig}) {
    AttentionOptions o;
    o.kernel = kernel;
    o.causal = causal;
    o.key_mask = KeyMaskView::contiguous(mask.data(), split.B, split.N);
    const auto ref = reference::favor_attention(q, k, v, w, o);
    AttentionOptions o32 = o;
    o32.scale = 0.25;
    const double naive_err =
        testing::rel_error(reference::naive::favor_attention<float>(q, k, v, w, o32), ref.values);
    set_num_threads(1);
    const Tensor one = favor_attention(q, k, v, w, o);
    for (int threads : {2, 3, 5, 8}) {
      set_num_threads(threads);
      const Tensor y = favor_attention(q, k, v, w, o);
      EXPECT_LE(testing::rel_error(y, ref.values), 2 * naive_err + 1e-6)
          << threads << " threads, " << to_string(kernel);
      // Splits change only the summation order: within float32 rounding of one another.
      EXPECT_LE(relative_frobenius_error(y, one), 2e-6)
          << threads << " threads, " << to_string(kernel);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Splits, ThreadSplits,
                         ::testing::Combine(::testing::Values(Split{1, 1, 700}, Split{1, 3, 333},
                                                              Split{2, 4, 130}, Split{1, 1, 10},
                                                              Split{1, 1, 1}),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           const Split s = std::get<0>(info.param);
                           return "B" + std::to_string(s.B) + "H" + std::to_string(s.H) + "N" +
                                  std::to_string(s.N) +
                                  (std::get<1>(info.param) ? "_causal" : "_bidir");
                         });

// Under a load favor runs its regions on the calling thread (cpu/team.hpp), with the split
// the configured threads give: the same bits as the team. One head and two threads splits the
// head into parts (bidirectional) and segments (causal); eight heads split the decoder's fused
// step into two runs of GEMMs.
TEST(Threads, ACallingThreadAloneGivesTheTeamsBits) {
  ThreadCount restore;
  set_num_threads(2);
  const auto bits_equal = [](const Tensor& a, const Tensor& b) {
    return a.values().size() == b.values().size() &&
           std::memcmp(a.values().data(), b.values().data(), a.values().size() * sizeof(float)) ==
               0;
  };
  const Projection w = Projection::draw(64, 16, {ProjectionKind::orthogonal, NormMode::chi, 4});
  for (bool causal : {false, true}) {  // one head, 2 threads: parts, or causal segments
    const Tensor q = random_tensor({1, 1, 3000, 16}, 1, 1.5),
                 k = random_tensor({1, 1, 3000, 16}, 2, 1.5), v = random_tensor({1, 1, 3000, 8}, 3);
    AttentionOptions o;
    o.causal = causal;
    cpu::reset_team_state();
    cpu::always_wake_team_for_test(true);  // whatever the timing of this build
    const int64_t before = cpu::team_regions();
    const Tensor team = favor_attention(q, k, v, w, o);
    cpu::always_wake_team_for_test(false);
    EXPECT_GT(cpu::team_regions(), before) << "the team did not run";
    cpu::run_alone_for(10'000'000'000);
    ASSERT_TRUE(cpu::team_contended());
    const int64_t during = cpu::team_regions();
    const Tensor alone = favor_attention(q, k, v, w, o);
    EXPECT_EQ(cpu::team_regions(), during) << "a team ran while contended";
    cpu::reset_team_state();
    EXPECT_TRUE(bits_equal(team, alone)) << (causal ? "causal" : "bidirectional");
  }
  // The decoder's fused step at the bench's size (D = Dv = 64, m = 256, 8 heads: two runs of
  // four heads' GEMMs).
  const Projection wd = Projection::draw(256, 64, {ProjectionKind::orthogonal, NormMode::chi, 5});
  const int64_t T = 6;
  const Tensor q = random_tensor({1, 8, T, 64}, 4, 2.8), k = random_tensor({1, 8, T, 64}, 5, 2.8),
               v = random_tensor({1, 8, T, 64}, 6);
  Decoder a(1, 8, 64, wd), b(1, 8, 64, wd);
  std::vector<Tensor> team, alone;
  cpu::reset_team_state();
  cpu::always_wake_team_for_test(true);
  const int64_t before = cpu::team_regions();
  for (int64_t t = 0; t < T; ++t)
    team.push_back(a.step(testing::tokens(q, t), testing::tokens(k, t), testing::tokens(v, t)));
  cpu::always_wake_team_for_test(false);
  EXPECT_GT(cpu::team_regions(), before) << "the team did not run";
  cpu::run_alone_for(10'000'000'000);
  const int64_t during = cpu::team_regions();
  for (int64_t t = 0; t < T; ++t)
    alone.push_back(b.step(testing::tokens(q, t), testing::tokens(k, t), testing::tokens(v, t)));
  EXPECT_EQ(cpu::team_regions(), during) << "a team ran while contended";
  cpu::reset_team_state();
  for (int64_t t = 0; t < T; ++t)
    EXPECT_TRUE(bits_equal(team[t], alone[t])) << "decoder step " << t;

  // The hybrid decoder's fused step, whose threads also write each head's entering token into
  // its ring slot after reading the leaving one there (window 3, sinks 1: tokens fold from the
  // fourth step on), against the same steps alone (the same bits) and against append then
  // query, which moves the ring's rows on the calling thread (the projections' rounding apart).
  HybridDecoder ha(1, 8, 64, wd, 3, 1), hb(1, 8, 64, wd, 3, 1), hs(1, 8, 64, wd, 3, 1);
  std::vector<Tensor> hteam, halone;
  cpu::always_wake_team_for_test(true);
  const int64_t hbefore = cpu::team_regions();
  for (int64_t t = 0; t < T; ++t)
    hteam.push_back(ha.step(testing::tokens(q, t), testing::tokens(k, t), testing::tokens(v, t)));
  cpu::always_wake_team_for_test(false);
  EXPECT_GT(cpu::team_regions(), hbefore) << "the team did not run the hybrid step";
  cpu::run_alone_for(10'000'000'000);
  const int64_t hduring = cpu::team_regions();
  for (int64_t t = 0; t < T; ++t)
    halone.push_back(hb.step(testing::tokens(q, t), testing::tokens(k, t), testing::tokens(v, t)));
  EXPECT_EQ(cpu::team_regions(), hduring) << "a team ran while contended";
  cpu::reset_team_state();
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_TRUE(bits_equal(hteam[t], halone[t])) << "hybrid step " << t;
    hs.append(testing::tokens(k, t), testing::tokens(v, t));
    const Tensor ref = hs.query(testing::tokens(q, t));
    double diff = 0.0, norm = 0.0;  // relative Frobenius error, test_decoder_step.cpp's bound
    for (int64_t i = 0; i < ref.numel(); ++i) {
      const double e = ref.values()[i], a = hteam[t].values()[i];
      diff += (a - e) * (a - e);
      norm += e * e;
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << "hybrid step " << t;
  }
}

// A small call (under cpu::kSerialFlops) runs on the calling thread without a parallel
// region, with the thread count BLAS reads set to 1 for the call: the caller's OpenMP setting
// is restored after it, whatever the call's size.
TEST(Threads, CallsRestoreTheCallersOpenMPSetting) {
  ThreadCount restore;
  set_num_threads(2);
  const int before = omp_get_max_threads();
  omp_set_num_threads(3);
  const Projection w = Projection::draw(64, 16, {ProjectionKind::orthogonal, NormMode::chi, 1});
  for (int64_t n : {1, 4, 300}) {  // short path, serial; tiled, serial; tiled, team of 2
    const Tensor q = random_tensor({1, 2, n, 16}, 1), k = random_tensor({1, 2, n, 16}, 2),
                 v = random_tensor({1, 2, n, 8}, 3);
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      favor_attention(q, k, v, w, o);
      EXPECT_EQ(omp_get_max_threads(), 3) << n << (causal ? " causal" : "");
      ExactOptions e;
      e.causal = causal;
      exact_attention(q, k, v, e);
      EXPECT_EQ(omp_get_max_threads(), 3) << n << " exact";
    }
  }
  omp_set_num_threads(before);
}

// A large Tensor's pages are mapped on favor's threads before its fill (src/core/tensor.cpp):
// every element still holds the fill, in memory an earlier tensor has just freed (a reused
// heap block keeps its old values) and at a size that ends inside a page, on one thread and
// on two; the caller's OpenMP setting is untouched.
TEST(Threads, LargeTensorsHoldTheirFillWhereverTheirMemoryComesFrom) {
  ThreadCount restore;
  const int before = omp_get_max_threads();
  const Shape4 shape{2, 4, 65536 + 3, 8};  // 16 MiB and 96 bytes
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (float fill : {0.0f, 2.5f}) {
      {
        const Tensor junk(shape, std::nanf(""));
      }
      const Tensor t(shape, fill);
      int64_t wrong = 0;
      for (float x : t.values()) wrong += x != fill;
      EXPECT_EQ(wrong, 0) << threads << " threads, fill " << fill;
      EXPECT_EQ(t.numel(), shape[0] * shape[1] * shape[2] * shape[3]);
    }
    EXPECT_EQ(omp_get_max_threads(), before);
  }
}

// The isolated-call rule (cpu/team.hpp) on team_now's own clock: after a reset the team has
// never run (deeply asleep), so a call that saves less than the deep wake-up runs alone; a run
// of such calls, each less than a deep sleep (10 ms) after the last, wakes the team once what
// they would have gained on a warm team exceeds it (before, each found the team asleep since
// the last one that used it and ran alone for ever); calls too small for a warm team never add
// up; a pause longer than a deep sleep starts the count again. A 1 ms sleep that overran to
// 10 ms would restart the count too (a loaded machine): the run of four is tried up to five
// times, and the rule must wake the team on the fourth call of one of them.
TEST(Threads, MidSizedCallsLessThanADeepSleepApartWakeASleepingTeam) {
  using namespace std::chrono_literals;
  const auto call = [](double saves_ms) {  // one region: the team it gets, then its end
    const int team = cpu::team_now(2, saves_ms * 1e6 * 50.0 * 2.0);  // 50 GFLOP/s, half saved
    {
      cpu::RegionClock clock(1);
    }  // (ended, alone or not)
    return team;
  };
  cpu::reset_team_state();
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(call(0.2), 1) << "a call smaller than a light wake-up, " << i;
    std::this_thread::sleep_for(1ms);
  }
  cpu::reset_team_state();
  // each saves 1.5 ms, 1.2 ms more than a light wake-up: the fourth passes the deep wake-up (4)
  EXPECT_EQ(call(1.5), 1);
  std::this_thread::sleep_for(1ms);
  EXPECT_EQ(call(1.5), 1);
  std::this_thread::sleep_for(12ms);  // a pause longer than a deep sleep: the count restarts
  bool woke = false;
  for (int attempt = 0; attempt < 5 && !woke; ++attempt) {
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(call(1.5), 1) << "attempt " << attempt << ", call " << i;
      std::this_thread::sleep_for(1ms);
    }
    woke = call(1.5) == 2;
    cpu::reset_team_state();
    std::this_thread::sleep_for(12ms);
  }
  EXPECT_TRUE(woke) << "four mid-sized calls 1 ms apart did not wake the team";
  EXPECT_EQ(call(5.0), 2) << "a call that pays a deep wake-up by itself";
  cpu::reset_team_state();
}

// A region outside the kernels that ran on the team (here the inputs' finite scan) leaves it
// awake: the kernel region after it uses the team. A windowed exact call at N = 1024 (8 heads:
// its band saves about 2 ms, less than waking a deeply asleep team) in a loop with pauses of a
// millisecond between the calls, as a Python loop has, ran alone every time before (the scans
// woke the team but did not say so, and each band found it asleep since the last band that used
// it); now the team runs its band. Under a load the scans run alone too.
TEST(Threads, ARegionThatRanOnTheTeamLeavesItAwakeForTheNext) {
  using namespace std::chrono_literals;
  ThreadCount restore;
  set_num_threads(2);
  const Tensor x = random_tensor({1, 8, 1024, 64}, 1);
  cpu::reset_team_state();
  EXPECT_EQ(cpu::team_now(2, 1e8), 1) << "after a reset the team is asleep";
  detail::check_finite(x.view(), "x");  // 8 slices of 64k floats: on the team
  EXPECT_EQ(cpu::team_now(2, 1e8), 2) << "the scan ran on the team, which is awake now";

  ExactOptions o;
  o.causal = true;
  o.window = 64;
  o.sinks = 4;
  const Tensor q = random_tensor({1, 8, 1024, 64}, 2), k = random_tensor({1, 8, 1024, 64}, 3),
               v = random_tensor({1, 8, 1024, 64}, 4);
  cpu::reset_team_state();
  const int64_t before = cpu::team_regions();
  for (int i = 0; i < 4; ++i) {
    (void)exact_attention(q, k, v, o);
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GT(cpu::team_regions(), before) << "the band never ran on the team";

  cpu::run_alone_for(10'000'000'000);
  const int64_t during = cpu::team_regions();
  (void)exact_attention(q, k, v, o);
  EXPECT_EQ(cpu::team_regions(), during) << "a team ran while contended";
  cpu::reset_team_state();
}

TEST(Threads, ExactAgreesAcrossThreadCounts) {
  ThreadCount restore;
  const Tensor q = random_tensor({1, 1, 300, 8}, 1, 2.0), k = random_tensor({1, 1, 300, 8}, 2, 2.0),
               v = random_tensor({1, 1, 300, 4}, 3);
  for (bool causal : {false, true}) {
    ExactOptions o;
    o.causal = causal;
    const auto ref = reference::exact_attention(q, k, v, o);
    for (int threads : {1, 2, 5}) {
      set_num_threads(threads);
      EXPECT_LE(testing::rel_error(exact_attention(q, k, v, o), ref.values), 1e-5) << threads;
    }
  }
}

}  // namespace
}  // namespace favor

namespace favor {
namespace {

TEST(Threads, BackwardAgreesAcrossThreadCounts) {
  ThreadCount restore;
  const Tensor q = testing::random_tensor({1, 3, 100, 8}, 1, 1.5),
               k = testing::random_tensor({1, 3, 100, 8}, 2, 1.5),
               v = testing::random_tensor({1, 3, 100, 5}, 3),
               dy = testing::random_tensor({1, 3, 100, 5}, 4);
  const Projection w = Projection::draw(24, 8);
  // FAVOR#: a per-head fit (dW_h per head, folded after the kernels: identical bits) and a
  // shared one (dW_h summed over heads in per-thread partials).
  const KernelFit head_fit =
      fit_kernel(Kernel::favorsharp, testing::random_tensor({1, 3, 30, 8}, 5),
                 testing::random_tensor({1, 3, 30, 8}, 6));
  const KernelFit shared_fit =
      fit_kernel(Kernel::favorsharp, testing::random_tensor({1, 1, 30, 8}, 5),
                 testing::random_tensor({1, 1, 30, 8}, 6));
  for (const KernelFit* fit : {static_cast<const KernelFit*>(nullptr), &head_fit, &shared_fit}) {
    for (bool causal : {false, true}) {
      AttentionOptions o;
      o.causal = causal;
      if (fit) {
        o.kernel = Kernel::favorsharp;
        o.fit = *fit;
      }
      const std::string what = to_string(o.kernel) + (causal ? " causal" : " bidirectional") +
                               (fit == &shared_fit ? ", shared fit" : "");
      set_num_threads(1);
      const AttentionGrads one = favor_attention_backward(q, k, v, dy, w, o, true);
      const AttentionGrads exact_one = exact_attention_backward(q, k, v, dy, {causal});
      for (int threads : {2, 3, 8}) {
        set_num_threads(threads);
        const AttentionGrads g = favor_attention_backward(q, k, v, dy, w, o, true);
        // Heads are independent: identical bits whatever the thread count; dW sums per-thread
        // partials (unless it has one part per head), so only its summation order changes.
        EXPECT_EQ(g.dq.values(), one.dq.values()) << threads << ' ' << what;
        EXPECT_EQ(g.dk.values(), one.dk.values()) << threads << ' ' << what;
        EXPECT_EQ(g.dv.values(), one.dv.values()) << threads << ' ' << what;
        EXPECT_LE(testing::rel_error(g.dw, std::vector<double>(one.dw.begin(), one.dw.end())), 1e-6)
            << threads << ' ' << what;
        if (fit == &head_fit) EXPECT_EQ(g.dw, one.dw) << threads << ' ' << what;
        const AttentionGrads e = exact_attention_backward(q, k, v, dy, {causal});
        EXPECT_EQ(e.dq.values(), exact_one.dq.values()) << threads;
        EXPECT_EQ(e.dk.values(), exact_one.dk.values()) << threads;
      }
    }
  }
}

}  // namespace
}  // namespace favor
