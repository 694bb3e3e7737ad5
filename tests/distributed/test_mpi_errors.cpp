// Bad use of sequence-parallel attention over MPI: every rank throws favor::Error (no rank
// hangs), naming the rank that failed or the disagreement.
#include "mpi_fixture.hpp"

namespace favor::mpitest {
namespace {

// The message of the favor::Error that `call` throws ("" and a test failure if none).
template <class F>
std::string error_of(F call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no favor::Error on rank " << rank();
  return "";
}

const FeatureMap kMap(Projection::draw(16, 8), Kernel::positive);

TEST(MpiErrors, WrongShapeOnOneRankFailsEveryRank) {
  // The last rank passes keys with another head dim: its validation fails, every rank throws.
  const Problem p(20, 20);
  const Local l(p, even_slice_of(p.nq), even_slice_of(p.nk));
  const int bad = size() - 1;
  const Tensor k_bad({p.batch, p.heads, l.ks.size(), 7});
  const TensorView k = rank() == bad ? k_bad.view() : l.k.view();
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    Tensor out = l.empty_out();
    const std::string forward =
        error_of([&] { distributed::attention(l.q, k, l.v, kMap, out.mutable_view(), o); });
    EXPECT_NE(forward.find("rank " + std::to_string(bad) + ":"), std::string::npos) << forward;
    EXPECT_NE(forward.find("head dim"), std::string::npos) << forward;
    const std::string backward =
        error_of([&] { distributed::attention_backward(l.q, k, l.v, l.dy, kMap, o); });
    EXPECT_NE(backward.find("rank " + std::to_string(bad) + ":"), std::string::npos) << backward;
  }
}

TEST(MpiErrors, DisagreeingOptionsOrProjections) {
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Problem p(20, 20);
  const Local l(p, even_slice_of(p.nq), even_slice_of(p.nk));
  Tensor out = l.empty_out();
  AttentionOptions o;
  o.causal = rank() == 1;  // one rank causal, the others not
  const std::string causal =
      error_of([&] { distributed::attention(l.q, l.k, l.v, kMap, out.mutable_view(), o); });
  EXPECT_NE(causal.find("disagree"), std::string::npos) << causal;
  EXPECT_NE(causal.find("causal"), std::string::npos) << causal;

  ProjectionOptions po;
  po.seed = rank() == size() - 1 ? 5 : 4;  // the last rank draws another projection
  const FeatureMap map(Projection::draw(16, 8, po), Kernel::positive);
  const std::string seed = error_of(
      [&] { distributed::attention_backward(l.q, l.k, l.v, l.dy, map, AttentionOptions{}); });
  EXPECT_NE(seed.find("disagree"), std::string::npos) << seed;
}

TEST(MpiErrors, VQCodebookThatDiffersOnOneRank) {
  // The last rank's codebook has one other value: forward and backward throw on every rank.
  if (size() < 2) GTEST_SKIP() << "needs two ranks";
  const Problem p(20, 20);
  const Local l(p, even_slice_of(p.nq), even_slice_of(p.nk));
  Tensor book = testing::random_tensor({1, p.heads, 6, p.d}, 4, 2.0);
  if (rank() == size() - 1) book.values()[7] += 1e-3f;
  const std::string differ =
      "disagree on the codebook (rank 0 and rank " + std::to_string(size() - 1) + " differ)";
  Tensor out = l.empty_out();
  const std::string forward = error_of(
      [&] { distributed::vq_attention(l.q, l.k, l.v, book, out.mutable_view(), VQOptions{}); });
  EXPECT_NE(forward.find(differ), std::string::npos) << forward;
  VQOptions causal;
  causal.causal = true;
  causal.tau = 0.5;
  const std::string backward = error_of(
      [&] { distributed::vq_attention_backward(l.q, l.k, l.v, l.dy, book, causal, true); });
  EXPECT_NE(backward.find(differ), std::string::npos) << backward;
}

TEST(MpiErrors, NullCommunicatorAndBadSlicesRefused) {
  EXPECT_THROW(distributed::MpiExchange{MPI_COMM_NULL}, Error);
  EXPECT_THROW(distributed::even_slice(10, 2, 2), Error);
  EXPECT_THROW(distributed::even_slice(-1, 0, 2), Error);
}

}  // namespace
}  // namespace favor::mpitest
