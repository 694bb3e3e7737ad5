// Sequence-parallel attention over MPI equals single-process favor attention, forward and
// backward, on uneven slices (rank 2 holds nothing when P >= 3). Run under mpirun with
// P = 1..4 (CTest: mpi_attention_np*); every rank checks its own slice.
#include "mpi_compare.hpp"

namespace favor::mpitest {
namespace {

const Kernel kRandomKernels[] = {Kernel::positive, Kernel::trig, Kernel::hyperbolic,
                                 Kernel::favorpp, Kernel::favorsharp};

Projection projection(int64_t m = 16, int64_t d = 8, uint64_t seed = 7) {
  ProjectionOptions po;
  po.seed = seed;
  return Projection::draw(m, d, po);
}

AttentionOptions causal_options() {
  AttentionOptions o;
  o.causal = true;
  return o;
}

TEST(MpiAttention, BidirectionalEveryKernel) {
  // FAVOR++ / FAVOR# without a fit: the ranks fit to their moments summed.
  const Problem p(45, 45);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  Worst worst("bidirectional");
  for (Kernel kernel : kRandomKernels) {
    const FeatureMap map(projection(), kernel);
    compare_forward(p, l, map, {}, false, worst, to_string(kernel));
    compare_backward(p, l, map, {}, false, true, worst, to_string(kernel));
  }
}

TEST(MpiAttention, CausalEveryKernel) {
  // N = 70: slices cross the causal chunks of 32. FAVOR++ / FAVOR# with a fit made on
  // calibration data (a causal fit must not see the sequence).
  const Problem p(70, 70);
  const Problem calibration(40, 40, 99);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  Worst worst("causal");
  for (Kernel kernel : kRandomKernels) {
    FeatureMap map(projection(), kernel);
    if (data_adapted(kernel)) map.fit = fit_kernel(kernel, calibration.q, calibration.k);
    compare_forward(p, l, map, causal_options(), false, worst, to_string(kernel));
    compare_backward(p, l, map, causal_options(), false, true, worst, to_string(kernel));
  }
}

TEST(MpiAttention, ProjectionOverloads) {
  const Problem p(45, 45);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  Worst worst("projection overloads");
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    o.kernel = Kernel::hyperbolic;
    const Projection w = projection();
    const Tensor want = favor_attention(p.q, p.k, p.v, w, o);
    Tensor out = l.empty_out();
    distributed::attention(l.q, l.k, l.v, w, out.mutable_view(), o);
    worst.check(slice_error(want, l.qs, out), causal ? "causal out" : "out");
    const AttentionGrads g_want = favor_attention_backward(p.q, p.k, p.v, p.dy, w, o, true);
    const AttentionGrads g = distributed::attention_backward(l.q, l.k, l.v, l.dy, w, o, true);
    worst.check(slice_error(g_want.dk, l.ks, g.dk), "dk");
    worst.check(vector_error(g_want.dw, sum_over_ranks(g.dw)), "dw");
  }
}

TEST(MpiAttention, LearnedMapParameterGradients) {
  const Problem p(45, 45);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  FeatureMap map(projection(8), Kernel::hedgehog);
  map.learnable(p.heads);
  for (size_t i = 0; i < map.bias.size(); ++i) {  // away from the starting point
    map.bias[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
    map.lambda[i] = 1.0f + 0.05f * static_cast<float>(i % 5);
  }
  Worst worst("hedgehog, learned");
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const std::string label = causal ? "causal" : "bidirectional";
    compare_forward(p, l, map, o, false, worst, label);
    compare_backward(p, l, map, o, false, true, worst, label);
  }
}

TEST(MpiAttention, KeyPaddingMask) {
  const Problem p(45, 45);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  Worst worst("key mask");
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.causal = causal;
    const FeatureMap map(projection(), Kernel::positive);
    const std::string label = causal ? "causal" : "bidirectional";
    compare_forward(p, l, map, o, true, worst, label);
    compare_backward(p, l, map, o, true, true, worst, label);
  }
}

TEST(MpiAttention, CausalDecay) {
  // Decay weights keys by their position in the whole sequence; its gradient sums the
  // ranks' shares (the backward's forward exclusive scan carries the distance states with the
  // key states; the reverse scan carries only R).
  const Problem p(70, 70);
  const Local l(p, my_slice(p.nq), my_slice(p.nk));
  AttentionOptions o = causal_options();
  o.decay = {0.9, 0.97};
  FeatureMap map(projection(), Kernel::positive);
  map.learnable(p.heads, false, false, true);
  Worst worst("causal decay");
  compare_forward(p, l, map, o, true, worst, "decay");
  compare_backward(p, l, map, o, true, true, worst, "decay");
}

TEST(MpiAttention, CrossAttentionOtherSlices) {
  // Nq != Nk and the query and key slices split differently (salt 1: rank 1 has no keys).
  const Problem p(30, 47);
  const Local l(p, my_slice(p.nq, 0), my_slice(p.nk, 1));
  Worst worst("cross attention");
  for (Kernel kernel : {Kernel::positive, Kernel::favorsharp}) {
    const FeatureMap map(projection(), kernel);
    compare_forward(p, l, map, {}, true, worst, to_string(kernel));
    compare_backward(p, l, map, {}, true, true, worst, to_string(kernel));
  }
}

TEST(MpiAttention, EdgeSlices) {
  // The first rank empty (salt 2: weights 0, 2, 5, 3), a sequence of one position (every rank
  // but one empty), and a rank whose keys are all masked out.
  FeatureMap map(projection(), Kernel::positive);
  map.learnable(4, false, true, false);  // B*H bias sets, one per (batch, head)
  Worst worst("edge slices");
  AttentionOptions decayed = causal_options();
  decayed.decay = {0.95};
  const Problem p(50, 50);
  const Local first_empty(p, my_slice(p.nq, 2), my_slice(p.nk, 2));
  for (const AttentionOptions& o : {AttentionOptions{}, decayed}) {
    const std::string label = o.causal ? "causal, first rank empty" : "first rank empty";
    compare_forward(p, first_empty, map, o, true, worst, label);
    compare_backward(p, first_empty, map, o, true, true, worst, label);
  }
  const Problem one(1, 1);
  const Local single(one, my_slice(1), my_slice(1));
  compare_forward(one, single, map, causal_options(), false, worst, "N = 1");
  compare_backward(one, single, map, causal_options(), false, true, worst, "N = 1");
  Problem masked(50, 50);
  const Slice ks = my_slice(masked.nk);
  if (size() > 1) {  // rank 1's keys all out (rank 0's too when alone)
    const Slice out = uneven_slice(masked.nk, 1, size());
    for (int64_t b = 0; b < masked.batch; ++b)
      for (int64_t j = out.begin; j < out.end; ++j) masked.mask[b * masked.nk + j] = 0;
  }
  const Local l(masked, my_slice(masked.nq), ks);
  for (const AttentionOptions& o : {AttentionOptions{}, decayed}) {
    const std::string label = o.causal ? "causal, a rank masked" : "a rank masked";
    compare_forward(masked, l, map, o, true, worst, label);
    compare_backward(masked, l, map, o, true, true, worst, label);
  }
}

}  // namespace
}  // namespace favor::mpitest
