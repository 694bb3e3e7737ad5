// Every library error path throws favor::Error (a std::invalid_argument) whose message
// names the argument and the rule, and leaves the output untouched.
#include <limits>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::expect_error;
using testing::random_tensor;

struct Inputs {
  Tensor q = random_tensor({2, 2, 10, 8}, 1), k = random_tensor({2, 2, 12, 8}, 2),
         v = random_tensor({2, 2, 12, 4}, 3);
  Projection w = Projection::draw(16, 8);
};

TEST(Errors, ShapeMismatches) {
  Inputs in;
  expect_error(
      [&] {
        favor_attention(in.q, random_tensor({2, 2, 12, 7}, 1), in.v, in.w);
      },
      "same head dim D");
  expect_error(
      [&] {
        favor_attention(in.q, in.k, random_tensor({2, 2, 11, 4}, 1), in.w);
      },
      "same length Nk");
  expect_error(
      [&] {
        favor_attention(random_tensor({1, 2, 10, 8}, 1), in.k, in.v, in.w);
      },
      "batch B and heads H");
  expect_error([&] { favor_attention(in.q, in.k, in.v, Projection::draw(16, 9)); },
               "projection: d = 9");
  AttentionOptions causal;
  causal.causal = true;
  expect_error([&] { favor_attention(in.q, in.k, in.v, in.w, causal); },
               "causal attention needs Nq == Nk");
  ExactOptions ecausal;
  ecausal.causal = true;
  expect_error([&] { exact_attention(in.q, in.k, in.v, ecausal); },
               "causal attention needs Nq == Nk");
  expect_error([&] { features(random_tensor({1, 1, 3, 5}, 1), in.w); }, "projection: d = 8");
}

TEST(Errors, EmptyExtentsAndBadViews) {
  Inputs in;
  Tensor empty({2, 2, 0, 8});
  expect_error([&] { favor_attention(empty, in.k, in.v, in.w); }, "every extent >= 1");
  TensorView null_view{nullptr, {1, 1, 1, 8}, {8, 8, 8, 1}};
  expect_error([&] { favor_attention(null_view, in.k, in.v, in.w); }, "null");
  TensorView negative{in.q.data(), in.q.shape(), {320, 80, -8, 1}};
  expect_error([&] { favor_attention(negative, in.k, in.v, in.w); }, "non-negative");
}

TEST(Errors, NonFiniteInputs) {
  Inputs in;
  in.q.at(1, 0, 3, 2) = NAN;
  expect_error([&] { favor_attention(in.q, in.k, in.v, in.w); }, "q: element [1,0,3,2] is nan");
  Inputs in2;
  in2.v.at(0, 1, 0, 0) = INFINITY;
  expect_error([&] { exact_attention(in2.q, in2.k, in2.v); }, "v: element [0,1,0,0] is inf");
  Inputs in3;
  in3.k.at(0, 0, 0, 0) = -INFINITY;
  Decoder dec(2, 2, 4, in3.w);
  expect_error([&] { dec.append(in3.k, in3.v); }, "k: element");
  expect_error([&] { features(in3.k, in3.w); }, "must be finite");
}

// Inputs large enough for the check to run on favor's threads (slice by slice): the message
// still names the first non-finite element in index order, whichever slice a thread scans
// first, for contiguous rows, strided rows and a strided head dimension.
TEST(Errors, NonFiniteInLargeInputsNamesTheFirstElement) {
  testing::ThreadCount restore;
  set_num_threads(2);
  Tensor q = random_tensor({2, 4, 4096, 8}, 1), k = random_tensor({2, 4, 4096, 8}, 2),
         v = random_tensor({2, 4, 4096, 8}, 3);
  const Projection w = Projection::draw(16, 8);
  q.at(1, 3, 4095, 7) = NAN;  // in the last slice, scanned by the second thread
  q.at(1, 1, 2000, 5) = INFINITY;
  expect_error([&] { favor_attention(q, k, v, w); }, "q: element [1,1,2000,5] is inf");
  q.at(0, 2, 17, 0) = -INFINITY;
  expect_error([&] { favor_attention(q, k, v, w); }, "q: element [0,2,17,0] is -inf");
  // Every other row of k (strided N) and every other column of v (strided D): the element
  // skipped by the view is not looked at, the one inside it is found.
  Tensor k2 = random_tensor({2, 4, 8192, 8}, 4), v2 = random_tensor({2, 4, 4096, 16}, 5);
  k2.at(0, 0, 1, 3) = NAN;  // a row the view skips
  TensorView k_rows{k2.data(), {2, 4, 4096, 8}, {4 * 8192 * 8, 8192 * 8, 16, 1}};
  TensorView v_cols{v2.data(), {2, 4, 4096, 8}, {4 * 4096 * 16, 4096 * 16, 16, 2}};
  const Tensor clean = random_tensor({2, 4, 4096, 8}, 6);
  EXPECT_NO_THROW(favor_attention(clean, k_rows, v_cols, w));
  k2.at(1, 2, 6, 4) = NAN;  // row 3 of the view
  expect_error([&] { favor_attention(clean, k_rows, v_cols, w); }, "k: element [1,2,3,4] is nan");
  v2.at(0, 3, 100, 9) = INFINITY;   // a column the view skips
  v2.at(0, 3, 100, 10) = INFINITY;  // column 5 of the view
  k2.at(1, 2, 6, 4) = 0;
  expect_error([&] { favor_attention(clean, k_rows, v_cols, w); }, "v: element [0,3,100,5] is inf");
}

TEST(Errors, ImpossibleParameters) {
  expect_error([] { Projection::draw(0, 8); }, "m must be >= 1");
  expect_error([] { Projection::draw(8, 0); }, "d must be >= 1");
  expect_error(
      [] {
        Projection::draw(8, 4, {ProjectionKind::iid, NormMode::fixed, 0});
      },
      "orthogonal projections only");
  expect_error([] { Projection::from_matrix(3, 2, {1, 2, 3}); }, "needs 6");
  expect_error([] { Projection::from_matrix(1, 2, {1, NAN}); }, "not finite");
  expect_error([] { Projection::from_matrix(1, 1, {1}).redraw(3); }, "cannot be redrawn");
  Inputs in;
  for (double bad : {0.0, -1.0, double(NAN), double(INFINITY)}) {
    AttentionOptions o;
    o.scale = bad;
    expect_error([&] { favor_attention(in.q, in.k, in.v, in.w, o); }, "scale");
  }
  expect_error([] { set_num_threads(0); }, "threads: 0 must be >= 1");
  expect_error([] { parse_kernel("softmax", "--kernel"); }, "--kernel: 'softmax' is not a kernel");
  expect_error([] { parse_projection_kind("hadamard", "--projection"); }, "--projection: 'hadamard'");
  expect_error([] { Decoder(0, 1, 1, Projection::draw(4, 4)); }, "batch: 0");
  expect_error([] { Tensor({1, 1, 2, 2}, std::vector<float>(3)); }, "needs 4 values");
}

TEST(Errors, MaskAndOutput) {
  Inputs in;
  std::vector<uint8_t> mask(24, 1);
  AttentionOptions o;
  o.key_mask = KeyMaskView::contiguous(mask.data(), 2, 11);
  expect_error([&] { favor_attention(in.q, in.k, in.v, in.w, o); },
               "key_mask: shape [2,11] must be [B, Nk] = [2,12]");
  Tensor wrong({2, 2, 10, 5}, 7.0f);
  expect_error([&] { favor_attention(in.q, in.k, in.v, in.w, wrong.mutable_view()); },
               "out: shape [2,2,10,5] must be [2,2,10,4]");
  for (float x : wrong.values()) EXPECT_EQ(x, 7.0f);  // nothing written
  // Output aliasing an input.
  MutableTensorView alias{in.q.data(), {2, 2, 10, 4}, {80, 40, 4, 1}};
  expect_error([&] { favor_attention(in.q, in.k, in.v, in.w, alias); }, "must not overlap");
  Decoder dec(2, 2, 4, in.w);
  expect_error(
      [&] {
        dec.append(in.k, random_tensor({2, 2, 12, 5}, 1));
      },
      "v: shape [2,2,12,5] must be [B, H, T, Dv]");
  expect_error([&] { dec.append(in.k, random_tensor({2, 2, 11, 4}, 1)); }, "same token count");
}

TEST(Errors, FeaturesOverflowIsReported) {
  // phi(x) as defined overflows float32 for |x|^2 scale/2 > ~88: the exact map refuses
  // rather than returning Inf.
  const Tensor x = random_tensor({1, 1, 2, 4}, 1, 40.0);
  expect_error(
      [&] {
        features(x, Projection::draw(8, 4), {Kernel::trig, 1.0});
      },
      "overflow float32");
}

TEST(Errors, MetricsRules) {
  expect_error(
      [] {
        relative_frobenius_error(Tensor({1, 1, 2, 2}, 1.0f), Tensor({1, 1, 2, 3}, 1.0f));
      },
      "shapes must match");
  expect_error(
      [] {
        relative_frobenius_error(Tensor({1, 1, 2, 2}, 1.0f), Tensor({1, 1, 2, 2}, 0.0f));
      },
      "norm is 0");
  Tensor bad({1, 1, 2, 2}, 1.0f);
  bad.at(0, 0, 1, 0) = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { relative_frobenius_error(bad, Tensor({1, 1, 2, 2}, 1.0f)); },
               "approx: element [0,0,1,0] is nan");
  expect_error(
      [&] { kernel_mse(bad, Tensor({1, 1, 2, 2}, 1.0f), Projection::draw(4, 2)); },
      "x: element [0,0,1,0] is nan");
}

}  // namespace
}  // namespace favor

namespace favor {
namespace {

TEST(Errors, FeaturesOverflowFarBeyondExpRange) {
  // Exponents far above float's range (here a - |x|^2/2 = e - 0.5 up to ~1e4) must still be
  // reported as overflow, not returned as finite values (the SIMD exp is only valid to ~104).
  for (float e : {150.0f, 950.0f, 9950.0f}) {
    const Projection w = Projection::from_matrix(1, 1, {e});
    const Tensor x({1, 1, 1, 1}, 1.0f);
    EXPECT_THROW(features(x, w, {Kernel::positive, 1.0}), Error) << e;
    EXPECT_THROW(features(x, w, {Kernel::hyperbolic, 1.0}), Error) << e;
  }
}

TEST(Errors, OutputWithZeroStrideIsRefused) {
  const Tensor q = testing::random_tensor({1, 2, 5, 4}, 1),
               k = testing::random_tensor({1, 2, 5, 4}, 2),
               v = testing::random_tensor({1, 2, 5, 3}, 3);
  std::vector<float> storage(15, 9.0f);
  MutableTensorView out{storage.data(), {1, 2, 5, 3}, {15, 0, 3, 1}};  // both heads on one block
  expect_error([&] { favor_attention(q, k, v, Projection::draw(8, 4), out); }, "zero stride");
  expect_error([&] { exact_attention(q, k, v, out); }, "zero stride");
  for (float x : storage) EXPECT_EQ(x, 9.0f);
}

}  // namespace
}  // namespace favor
