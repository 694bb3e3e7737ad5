// MpiExchange's collectives against their definitions (sequence_parallel.hpp), and the
// communication volume of a call: what one rank sends does not depend on N.
#include <limits>

#include "mpi_fixture.hpp"

namespace favor::mpitest {
namespace {

// Rank i's block: 3 heads of 4-float states with distance states; head 1 of rank 1 empty.
StateBlock block_of(int i) {
  StateBlock b(3, 4, true);
  for (int64_t h = 0; h < 3; ++h) {
    if (i == 1 && h == 1) continue;
    b.header(h).max = 0.5 * ((i * 7 + h * 3) % 5) - 1.0;
    b.header(h).length = i + 2.0;
    for (int64_t x = 0; x < 4; ++x) {
      b.state(h)[x] = 0.1f * static_cast<float>((i * 13 + h * 5 + x * 3) % 11) + 0.05f;
      b.distance_state(h)[x] = 0.2f * static_cast<float>((i * 3 + x) % 7);
    }
  }
  return b;
}

// The combination of ranks `order` in that order (the first is the earliest).
StateBlock fold(const std::vector<int>& order) {
  StateBlock acc(3, 4, true);
  for (int i : order) {
    StateBlock next = block_of(i);
    combine_states(acc.data(), next.data(), 3, acc.record_bytes());
    acc = next;
  }
  return acc;
}

void expect_blocks_near(const StateBlock& got, const StateBlock& want, const std::string& what) {
  for (int64_t h = 0; h < 3; ++h) {
    EXPECT_EQ(got.header(h).max, want.header(h).max) << what << " head " << h;
    EXPECT_EQ(got.header(h).length, want.header(h).length) << what << " head " << h;
    for (int64_t x = 0; x < 4; ++x) {  // float sums in another association: a few ulps
      EXPECT_NEAR(got.state(h)[x], want.state(h)[x], 1e-5 * (1 + std::abs(want.state(h)[x])));
      EXPECT_NEAR(got.distance_state(h)[x], want.distance_state(h)[x],
                  1e-5 * (1 + std::abs(want.distance_state(h)[x])))
          << what << " head " << h;
    }
  }
}

TEST(MpiExchange, CollectivesMatchTheirDefinitions) {
  distributed::MpiExchange ex;
  const int r = ex.rank(), p = ex.size();
  ASSERT_EQ(p, size());
  const std::vector<int64_t> all = ex.allgather({r, 10 * r});
  ASSERT_EQ(all.size(), 2u * p);
  for (int i = 0; i < p; ++i) EXPECT_EQ(all[2 * i + 1], 10 * i);
  const std::vector<std::string> texts = ex.allgather_text(std::string(r, 'x'));  // rank 0: ""
  ASSERT_EQ(texts.size(), static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) EXPECT_EQ(texts[i], std::string(i, 'x'));
  double d[2] = {1.0, 0.5 * r};
  float f[1] = {2.0f};
  ex.allreduce_sum(d, 2);
  ex.allreduce_sum(f, 1);
  EXPECT_EQ(d[0], p);
  EXPECT_EQ(d[1], 0.25 * p * (p - 1));
  EXPECT_EQ(f[0], 2.0f * p);

  std::vector<int> before, after, every;
  for (int i = 0; i < p; ++i) {
    if (i < r) before.push_back(i);
    if (i > r) after.insert(after.begin(), i);  // P-1 first: the later rank is `earlier`
    every.push_back(i);
  }
  StateBlock block = block_of(r);
  ex.allreduce_states(block);
  expect_blocks_near(block, fold(every), "allreduce");
  block = block_of(r);
  ex.exscan_states(block, false);
  expect_blocks_near(block, fold(before), "exscan");
  block = block_of(r);
  ex.exscan_states(block, true);
  expect_blocks_near(block, fold(after), "reverse exscan");

  EXPECT_GT(ex.bytes(), 3 * block.bytes());
  EXPECT_GE(ex.seconds(), 0.0);
  ex.reset_counters();
  EXPECT_EQ(ex.bytes(), 0);
}

TEST(MpiPayload, IndependentOfSequenceLength) {
  const FeatureMap map(Projection::draw(16, 8), Kernel::positive);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    int64_t forward[2] = {0, 0}, backward[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      const Problem p(i == 0 ? 40 : 90, i == 0 ? 40 : 90);
      const Local l(p, my_slice(p.nq), my_slice(p.nk));
      Tensor out = l.empty_out();
      forward[i] = distributed::attention(l.q, l.k, l.v, map, out.mutable_view(), o).payload_bytes;
      SequenceParallelStats st;
      distributed::attention_backward(l.q, l.k, l.v, l.dy, map, o, false, &st);
      backward[i] = st.payload_bytes;
    }
    // Forward: one state block, B H records of F (Dv + 1) floats and a header.
    EXPECT_EQ(forward[0], StateBlock(2 * 2, 16 * (5 + 1)).bytes());
    EXPECT_EQ(forward[0], forward[1]) << "N = 40 and 90";
    EXPECT_EQ(backward[0], backward[1]) << "N = 40 and 90";
    if (rank() == 0) {
      std::printf(
          "    %s payload per rank (B = H = 2, F = 16, Dv = 5; N = 40 and 90): "
          "forward %lld bytes, backward %lld bytes\n",
          causal ? "causal" : "bidirectional", static_cast<long long>(forward[0]),
          static_cast<long long>(backward[0]));
    }
  }
}

}  // namespace
}  // namespace favor::mpitest
