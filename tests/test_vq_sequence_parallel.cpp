// Sequence-parallel Transformer-VQ attention (favor/sequence_parallel.hpp) with P = 1..4
// ranks played by threads (tests/thread_exchange.hpp): every rank's slice of the output and
// of dq, dk, dv, and the codebook gradient summed over ranks, equal single-process
// vq_attention / vq_attention_backward on the whole sequence, for hard and soft VQ, both
// directions, per-head and shared codebooks, masks (also a rank whose keys are all masked),
// uneven and empty slices, cross attention and a causal block length that differs from the
// backward's; bad input on one rank, or ranks that disagree, throw on every rank; the bytes
// sent do not grow with N. Rerun with ./favor_tests --gtest_filter='*VQSequenceParallel*'
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "slice_helpers.hpp"
#include "test_helpers.hpp"
#include "thread_exchange.hpp"

// A namespace of its own: the unity build compiles several test files as one source
// (cmake/FavorUnity.cmake), and their helpers (Case, cases(), ...) share names.
namespace favor::test_vq_sequence_parallel {
namespace {
using testing::bounds_of;
using testing::max_abs;
using testing::max_diff;
using testing::random_tensor;
using testing::rows_of;

enum class Mask { none, periodic, prefix };

struct Case {
  std::string name;
  bool causal = false;
  bool soft = false;
  bool shared = false;  // one codebook for every head
  Mask mask = Mask::none;
  int64_t nq = 300, nk = 300;
  int64_t block = 0;
  std::vector<int> weights;   // slice weights, one per rank
  std::vector<int> kweights;  // the keys' (bidirectional), when not the queries'
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

// The tolerance, as for sequence-parallel FAVOR (test_sequence_parallel.cpp): the split only
// reorders float sums (per-code sums of up to N = 300 keys, query-side sums over up to 300
// rows, the codebook gradient summed over ranks) and moves hard VQ's key gradient from the
// direct route to the moments (both exact, cpu/vq_key_routes.hpp): a few ulps of the
// largest terms, far inside 2e-4 of the largest magnitude, while a wrong per-code sum (a
// missing or doubled rank) is off by O(1).
constexpr double kTolerance = 2e-4;

class VQSequenceParallel : public ::testing::TestWithParam<Case> {};

TEST_P(VQSequenceParallel, EqualsTheWholeSequence) {
  const Case c = GetParam();
  const int64_t B = 2, H = 2, D = 16, Dv = 8, codes = 16;
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  const Tensor q = random_tensor({B, H, c.nq, D}, 41, 2.0);
  const Tensor k = random_tensor({B, H, c.nk, D}, 42, 2.0);
  const Tensor v = random_tensor({B, H, c.nk, Dv}, 43);
  const Tensor dy = random_tensor({B, H, c.nq, Dv}, 44);
  const Tensor book = random_tensor({1, c.shared ? 1 : H, codes, D}, 45, 2.0);
  if (!c.soft) ASSERT_EQ(testing::vq_near_ties(k, book), 0) << "a near-tie: pick other seeds";
  std::vector<uint8_t> mask(static_cast<size_t>(B * c.nk), 1);
  if (c.mask == Mask::periodic) mask = testing::periodic_mask(mask.size(), 5, 2);
  // The first 55% of the keys masked: with the splits below, rank 0 has no visible key
  // (causal: zero rows; its key sums are zero).
  if (c.mask == Mask::prefix)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < c.nk * 55 / 100; ++j) mask[b * c.nk + j] = 0;
  VQOptions o;
  o.causal = c.causal;
  o.tau = c.soft ? 1.0 : 0.0;
  o.block = c.block;
  if (c.mask != Mask::none) o.key_mask = KeyMaskView::contiguous(mask.data(), B, c.nk);
  VQStats whole_stats;
  const Tensor whole = vq_attention(q, k, v, book, o, &whole_stats);
  const VQGrads g = vq_attention_backward(q, k, v, dy, book, o, true);
  const double scale_out = max_abs(whole.values()), scale_dq = max_abs(g.dq.values()),
               scale_dk = max_abs(g.dk.values()), scale_dv = max_abs(g.dv.values());

  const int P = static_cast<int>(c.weights.size());
  const std::vector<int64_t> qb = bounds_of(c.nq, c.weights),
                             kb = bounds_of(c.nk, c.kweights.empty() ? c.weights : c.kweights);
  std::mutex lock;
  std::vector<float> dcodebook(g.dcodebook.values().size(), 0.0f);
  int64_t zero_rows = 0;
  std::vector<std::string> failures(static_cast<size_t>(P));
  std::vector<int64_t> offsets(static_cast<size_t>(P)), totals(static_cast<size_t>(P));
  testing::run_ranks(P, [&](testing::ThreadExchange& ex) {
    const int r = ex.rank();
    const Tensor qs = rows_of(q, qb[r], qb[r + 1]), ks = rows_of(k, kb[r], kb[r + 1]),
                 vs = rows_of(v, kb[r], kb[r + 1]), dys = rows_of(dy, qb[r], qb[r + 1]);
    std::vector<uint8_t> mask_s;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = kb[r]; j < kb[r + 1]; ++j) mask_s.push_back(mask[b * c.nk + j]);
    VQOptions os = o;
    if (c.mask != Mask::none)
      os.key_mask = KeyMaskView::contiguous(mask_s.data(), B, kb[r + 1] - kb[r]);
    Tensor out({B, H, qb[r + 1] - qb[r], Dv});
    try {
      const SequenceParallelStats st =
          sequence_parallel_vq_attention(qs, ks, vs, book, out.mutable_view(), os, ex);
      offsets[r] = st.offset;
      totals[r] = st.total;
      const VQGrads gs =
          sequence_parallel_vq_attention_backward(qs, ks, vs, dys, book, os, ex, true);
      std::string f;
      const double eo = max_diff(out, whole, qb[r]) / scale_out;
      const double eq = max_diff(gs.dq, g.dq, qb[r]) / scale_dq;
      const double ek = max_diff(gs.dk, g.dk, kb[r]) / scale_dk;
      const double ev = max_diff(gs.dv, g.dv, kb[r]) / scale_dv;
      if (!(eo <= kTolerance)) f += " out " + std::to_string(eo);
      if (!(eq <= kTolerance)) f += " dq " + std::to_string(eq);
      if (!(ek <= kTolerance)) f += " dk " + std::to_string(ek);
      if (!(ev <= kTolerance)) f += " dv " + std::to_string(ev);
      if (gs.dcodebook.shape() != book.shape()) f += " dcodebook shape";
      failures[r] = f;
      std::lock_guard<std::mutex> guard(lock);
      zero_rows += st.zero_rows;
      for (size_t i = 0; i < dcodebook.size() && f.empty(); ++i)
        dcodebook[i] += gs.dcodebook.values()[i];
    } catch (const std::exception& e) {
      failures[r] = std::string(" threw: ") + e.what();
    }
  });
  for (int r = 0; r < P; ++r) {
    EXPECT_EQ(failures[r], "") << "rank " << r << " of " << P;
    EXPECT_EQ(offsets[r], kb[r]) << "rank " << r;
    EXPECT_EQ(totals[r], c.nk) << "rank " << r;
  }
  EXPECT_EQ(zero_rows, whole_stats.zero_rows);
  if (c.causal && c.mask == Mask::prefix) EXPECT_GT(zero_rows, 0);
  const std::vector<float>& want = g.dcodebook.values();
  const double scale_dc = std::max(max_abs(want), 1e-30);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_LE(std::abs(double(dcodebook[i]) - want[i]) / scale_dc, kTolerance)
        << "dcodebook[" << i << "] summed over ranks";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // One rank; two even; three uneven; four with an empty one.
  const std::vector<std::vector<int>> splits = {{1}, {1, 1}, {3, 1, 2}, {2, 0, 3, 1}};
  for (bool causal : {false, true})
    for (bool soft : {false, true})
      for (const auto& w : splits) {
        const std::string p = "_P" + std::to_string(w.size());
        const std::string kind =
            std::string(causal ? "causal" : "bidirectional") + (soft ? "_soft" : "_hard");
        Case c;
        c.causal = causal;
        c.soft = soft;
        c.weights = w;
        c.name = kind + p;
        out.push_back(c);
        Case masked = c;
        masked.shared = true;
        masked.mask = Mask::periodic;
        masked.name = kind + "_shared_masked" + p;
        out.push_back(masked);
        Case prefix = c;
        prefix.mask = Mask::prefix;
        prefix.name = kind + "_prefix_masked" + p;
        out.push_back(prefix);
        Case other = c;
        if (causal) {  // a forward block that is not the backward's (and not a divisor)
          other.block = 7;
          other.mask = Mask::periodic;
          other.name = kind + "_block7_masked" + p;
        } else {
          other.nk = 170;
          other.shared = true;
          other.name = kind + "_cross_shared" + p;
        }
        out.push_back(other);
        if (!causal && w.size() == 3) {  // a rank with queries only, one with keys only
          Case apart = c;
          apart.weights = {1, 0, 2};
          apart.kweights = {0, 2, 1};
          apart.mask = Mask::periodic;
          apart.name = kind + "_queries_apart_from_keys" + p;
          out.push_back(apart);
        }
      }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Split, VQSequenceParallel, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Runs the forward call on P ranks where `tweak` may change a rank's inputs; returns every
// rank's error message ("" when it did not throw).
std::vector<std::string> errors_of(
    int P, const std::function<void(int, Tensor&, VQOptions&, Tensor&)>& tweak) {
  std::vector<std::string> errors(static_cast<size_t>(P));
  testing::run_ranks(P, [&](testing::ThreadExchange& ex) {
    const int r = ex.rank();
    Tensor q = random_tensor({1, 2, 10 + r, 8}, 1), k = random_tensor({1, 2, 10 + r, 8}, 2),
           v = random_tensor({1, 2, 10 + r, 4}, 3), book = random_tensor({1, 2, 6, 8}, 4);
    VQOptions o;
    tweak(r, q, o, book);
    Tensor out({1, 2, q.shape()[2], 4});
    try {
      sequence_parallel_vq_attention(q, k, v, book, out.mutable_view(), o, ex);
    } catch (const Error& e) {
      errors[r] = e.what();
    }
  });
  return errors;
}

TEST(VQSequenceParallelErrors, ABadSliceOnOneRankStopsEveryRank) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  const auto errors = errors_of(3, [](int r, Tensor&, VQOptions&, Tensor& book) {
    if (r == 1) book = random_tensor({1, 2, 6, 5}, 4);  // D = 5 against the keys' 8
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("sequence-parallel VQ attention: rank 1: codebook"), std::string::npos)
        << errors[r];
  }
  const auto tau = errors_of(2, [](int r, Tensor&, VQOptions& o, Tensor&) {
    if (r == 0) o.tau = -1.0;
  });
  for (int r = 0; r < 2; ++r) EXPECT_NE(tau[r].find("rank 0: tau"), std::string::npos) << tau[r];
}

TEST(VQSequenceParallelErrors, RanksThatDisagreeStopEveryRank) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  const auto values = errors_of(3, [](int r, Tensor&, VQOptions&, Tensor& book) {
    if (r == 2) book.values()[7] += 1e-3f;  // the same shape, other values
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(values[r].find("disagree on the codebook (rank 0 and rank 2 differ)"),
              std::string::npos)
        << values[r];
  const auto codes = errors_of(2, [](int r, Tensor&, VQOptions&, Tensor& book) {
    if (r == 1) book = random_tensor({1, 2, 7, 8}, 4);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(codes[r].find("disagree on the codes c (rank 0: 6, rank 1: 7)"), std::string::npos)
        << codes[r];
  const auto tau = errors_of(2, [](int r, Tensor&, VQOptions& o, Tensor&) {
    if (r == 1) o.tau = 0.5;
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(tau[r].find("disagree on the tau"), std::string::npos) << tau[r];
  const auto causal = errors_of(2, [](int r, Tensor& q, VQOptions& o, Tensor&) {
    if (r == 1) {
      o.causal = true;
      q = random_tensor({1, 2, 11, 8}, 1);  // Nq == Nk: valid on its own
    }
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(causal[r].find("disagree on the causal"), std::string::npos) << causal[r];
  // The block length need not agree: the result does not depend on it.
  const auto block = errors_of(2, [](int r, Tensor& q, VQOptions& o, Tensor&) {
    o.causal = true;
    q = random_tensor({1, 2, 10 + r, 8}, 1);
    o.block = r == 0 ? 3 : 0;
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(block[r], "");
}

// Bytes this rank sent in the forward and backward calls of a (hard or soft, causal or
// bidirectional) problem of n tokens on 2 ranks.
std::vector<int64_t> payload(int64_t n, bool causal, bool soft) {
  std::vector<int64_t> bytes(4);
  testing::run_ranks(2, [&](testing::ThreadExchange& ex) {
    const Tensor q = random_tensor({1, 2, n, 8}, 1), k = random_tensor({1, 2, n, 8}, 2),
                 v = random_tensor({1, 2, n, 4}, 3), dy = random_tensor({1, 2, n, 4}, 5),
                 book = random_tensor({1, 2, 6, 8}, 4);
    VQOptions o;
    o.causal = causal;
    o.tau = soft ? 0.5 : 0.0;
    Tensor out({1, 2, n, 4});
    const int r = ex.rank();
    bytes[2 * r] =
        sequence_parallel_vq_attention(q, k, v, book, out.mutable_view(), o, ex).payload_bytes;
    SequenceParallelStats st;
    sequence_parallel_vq_attention_backward(q, k, v, dy, book, o, ex, true, &st);
    bytes[2 * r + 1] = st.payload_bytes;
  });
  EXPECT_EQ(bytes[0], bytes[2]);
  EXPECT_EQ(bytes[1], bytes[3]);
  return {bytes[0], bytes[1]};
}

TEST(VQSequenceParallelStats, CommunicationDoesNotGrowWithN) {
  testing::ThreadCount restore;  // the next test starts at the default count
  set_num_threads(1);
  // B H = 2 heads, c = 6 codes, D = 8, Dv = 4. Key sums: c (Dv + 1) = 30 floats per head;
  // query-side sums: U and r, c (Dv + 1) = 30 floats (soft), plus T and w, c D (Dv + 1) = 240
  // (hard). Causal records add a 32-byte header per head (30 floats: 120 bytes, no padding).
  for (bool causal : {false, true})
    for (bool soft : {false, true}) {
      const std::vector<int64_t> small = payload(64, causal, soft),
                                 big = payload(2048, causal, soft);
      EXPECT_EQ(small, big);
      const int64_t header = causal ? 32 : 0;
      EXPECT_EQ(small[0], 2 * (header + 30 * 4));
      EXPECT_EQ(small[1], small[0] + 2 * (header + (soft ? 30 : 270) * 4));
    }
}

}  // namespace
}  // namespace favor::test_vq_sequence_parallel
