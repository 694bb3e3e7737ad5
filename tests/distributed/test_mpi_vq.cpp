// Sequence-parallel Transformer-VQ attention over MPI (distributed::vq_attention and its
// backward) equals single-process vq_attention / vq_attention_backward: every rank's slice of
// the output and of dq, dk, dv, and the codebook gradient summed over ranks, for hard and soft
// VQ, bidirectional and causal, per-head and shared codebooks, masks (also a rank with no
// visible key), uneven and empty slices and cross attention. Run under mpirun with P = 1..4
// (CTest: mpi_attention_np*); the thread-rank tests (tests/test_vq_sequence_parallel.cpp)
// cover the algorithm's splits more widely, these the MPI exchange under it.
#include "mpi_compare.hpp"

namespace favor::mpitest {
namespace {

/// A codebook [1, Hc, c, D] for a Problem (codes of the keys' norms). Hard VQ compares the
/// assignments of two tilings of the keys (a slice against the whole sequence), so the keys
/// must have no near-tie between their two nearest codes (test_helpers.hpp): every rank
/// builds the same inputs and fails this alike.
Tensor codebook_for(const Problem& p, bool shared, int64_t codes = 12, uint64_t seed = 71) {
  return testing::random_tensor({1, shared ? 1 : p.heads, codes, p.d}, seed, 2.0);
}

struct VQCase {
  std::string label;
  bool causal = false, soft = false, shared = false, masked = false;
  int64_t block = 0;  // the forward's causal block length (0: the library's default)
};

VQOptions options_of(const VQCase& c) {
  VQOptions o;
  o.causal = c.causal;
  o.tau = c.soft ? 0.7 : 0.0;
  return o;
}

/// Forward and backward of one case on this rank's slices against the whole problem.
void compare_vq(const Problem& p, const Local& l, const VQCase& c, Worst& worst) {
  const Tensor book = codebook_for(p, c.shared);
  if (!c.soft) ASSERT_EQ(testing::vq_near_ties(p.k, book), 0) << c.label << ": pick a seed";
  VQOptions full = options_of(c), local = full;
  if (c.masked) {
    full.key_mask = KeyMaskView::contiguous(p.mask.data(), p.batch, p.nk);
    local.key_mask = l.mask_view();
  }
  local.block = c.block;  // need not be the whole problem's: the result does not depend on it

  VQStats whole_stats;
  const Tensor want = vq_attention(p.q, p.k, p.v, book, full, &whole_stats);
  Tensor out = l.empty_out();
  const SequenceParallelStats st =
      distributed::vq_attention(l.q, l.k, l.v, book, out.mutable_view(), local);
  worst.check(slice_error(want, l.qs, out), c.label + " out");
  EXPECT_EQ(st.offset, l.ks.begin) << c.label;
  EXPECT_EQ(st.total, p.nk) << c.label;
  int64_t zero_rows = st.zero_rows;
  MPI_Allreduce(MPI_IN_PLACE, &zero_rows, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(zero_rows, whole_stats.zero_rows) << c.label << ": zero rows over ranks";

  const VQGrads g_want = vq_attention_backward(p.q, p.k, p.v, p.dy, book, full, true);
  local.block = 0;
  SequenceParallelStats bst;
  const VQGrads g =
      distributed::vq_attention_backward(l.q, l.k, l.v, l.dy, book, local, true, &bst);
  worst.check(slice_error(g_want.dq, l.qs, g.dq), c.label + " dq");
  worst.check(slice_error(g_want.dk, l.ks, g.dk), c.label + " dk");
  worst.check(slice_error(g_want.dv, l.ks, g.dv), c.label + " dv");
  ASSERT_EQ(g.dcodebook.shape(), book.shape()) << c.label;
  worst.check(vector_error(g_want.dcodebook.values(), sum_over_ranks(g.dcodebook.values())),
              c.label + " dcodebook summed over ranks");
  EXPECT_GT(bst.payload_bytes, st.payload_bytes) << c.label << ": the backward sends more";
}

std::vector<VQCase> cases(bool causal) {
  std::vector<VQCase> out;
  for (bool soft : {false, true}) {
    const std::string kind =
        std::string(causal ? "causal" : "bidirectional") + (soft ? " soft" : " hard");
    out.push_back({kind, causal, soft, false, false, 0});
    // Causal: a forward block of 5 + rank, other than the backward's and every other rank's.
    out.push_back({kind + ", shared codebook, masked", causal, soft, true, true, causal ? 5 : 0});
  }
  return out;
}

TEST(MpiVQ, Bidirectional) {
  const Problem p(45, 45);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));  // rank 2 empty from P = 3
  Worst worst("vq bidirectional");
  for (const VQCase& c : cases(false)) compare_vq(p, l, c, worst);
}

TEST(MpiVQ, Causal) {
  // N = 70 on uneven slices: they cross the causal blocks.
  const Problem p(70, 70);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  Worst worst("vq causal");
  for (VQCase c : cases(true)) {
    if (c.block > 0) c.block += rank();
    compare_vq(p, l, c, worst);
  }
}

TEST(MpiVQ, CrossAttentionOtherSlices) {
  // Nq != Nk and the query and key slices split differently (salt 1: rank 1 has no keys).
  const Problem p(30, 47);
  const Local l(p, my_slice(p.nq, 0), my_slice(p.nk, 1));
  Worst worst("vq cross attention");
  for (bool soft : {false, true})
    compare_vq(p, l, {soft ? "soft" : "hard", false, soft, false, true, 0}, worst);
}

TEST(MpiVQ, EdgeSlices) {
  // The first rank empty (salt 2), a sequence of one position, and the first 60% of the keys
  // masked out: the first ranks see no key (causal: zero rows; their key sums are zero).
  Worst worst("vq edge slices");
  const Problem p(50, 50);
  const Local first_empty(p, my_slice(p.nq, 2), my_slice(p.nk, 2));
  for (bool causal : {false, true})
    compare_vq(
        p, first_empty,
        {causal ? "causal, first rank empty" : "first rank empty", causal, true, false, true, 0},
        worst);
  const Problem one(1, 1);
  const Local single(one, my_slice(1), my_slice(1));
  for (bool soft : {false, true})
    compare_vq(one, single, {soft ? "N = 1 soft" : "N = 1 hard", true, soft, true, false, 0},
               worst);
  Problem prefix(50, 50);
  for (int64_t b = 0; b < prefix.batch; ++b)
    for (int64_t j = 0; j < prefix.nk * 6 / 10; ++j) prefix.mask[b * prefix.nk + j] = 0;
  const Local l(prefix, my_slice(prefix.nq), my_slice(prefix.nk));
  for (bool causal : {false, true})
    for (bool soft : {false, true}) {
      const std::string label = std::string(causal ? "causal" : "bidirectional") +
                                (soft ? " soft" : " hard") + ", keys 0..29 masked";
      compare_vq(prefix, l, {label, causal, soft, false, true, 0}, worst);
    }
}

}  // namespace
}  // namespace favor::mpitest
