// Decoder and VQDecoder state: state() -> load_state() into a fresh decoder continues bit for
// bit; select(indices) equals decoders built from the reordered batch; bad states and
// indices throw naming the field.
#include <gtest/gtest.h>

#include <cmath>

#include "map_fixture.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::tokens;

/// Batch rows indices[0], indices[1], ... of a C-contiguous [B, H, N, X] tensor.
Tensor batch_rows(const Tensor& t, const std::vector<int64_t>& indices) {
  const Shape4 s = t.shape();
  const int64_t row = s[1] * s[2] * s[3];
  Tensor out({static_cast<int64_t>(indices.size()), s[1], s[2], s[3]});
  for (size_t i = 0; i < indices.size(); ++i)
    std::copy(t.data() + indices[i] * row, t.data() + (indices[i] + 1) * row,
              out.data() + static_cast<int64_t>(i) * row);
  return out;
}

/// Appends tokens [begin, end) in groups (a prefill of 5, then single tokens), querying
/// after each group; returns every query output, concatenated.
template <class D>
std::vector<float> run(D& dec, const Tensor& q, const Tensor& k, const Tensor& v, int64_t begin,
                       int64_t end) {
  std::vector<float> out;
  for (int64_t i = begin; i < end;) {
    const int64_t n = i == begin ? std::min<int64_t>(5, end - i) : 1;
    dec.append(tokens(k, i, n), tokens(v, i, n));
    const Tensor y = dec.query(tokens(q, i + n - 1));
    out.insert(out.end(), y.values().begin(), y.values().end());
    i += n;
  }
  return out;
}

struct MapCase {
  Kernel kernel;
  std::vector<double> decay;
  int64_t learned_sets = 0;  // > 0: per-head W, b, lambda in this many sets
};

FeatureMap make_map(const MapCase& c, int64_t D) {
  const Projection w = Projection::draw(24, D, {ProjectionKind::orthogonal, NormMode::chi, 6});
  if (c.learned_sets > 0)
    return testing::random_map(c.kernel, w, {c.learned_sets, true, true, true}, 17);
  FeatureMap map(w, c.kernel);
  if (data_adapted(c.kernel)) map.fit = KernelFit::constant(-0.1, D);
  return map;
}

class DecoderStateIO : public ::testing::TestWithParam<MapCase> {
 protected:
  Decoder make(int64_t batch) const {
    DecoderOptions o;
    o.decay = GetParam().decay;
    return Decoder(batch, H, Dv, make_map(GetParam(), D), o);
  }
  static constexpr int64_t B = 3, H = 2, N = 24, D = 8, Dv = 5;
  const Tensor q = random_tensor({B, H, N, D}, 51, 1.5), k = random_tensor({B, H, N, D}, 52, 1.5),
               v = random_tensor({B, H, N, Dv}, 53);
};

TEST_P(DecoderStateIO, ExportImportContinuesBitIdentical) {
  Decoder a = make(B);
  run(a, q, k, v, 0, 10);
  Decoder b = make(B);
  // Before loading, b holds nothing: its outputs are zeros, a's are not.
  const Tensor yb = b.query(tokens(q, 10)), ya = a.query(tokens(q, 10));
  EXPECT_NE(yb.values(), ya.values());
  b.load_state(a.state());
  EXPECT_EQ(b.position(), 10);
  EXPECT_EQ(run(a, q, k, v, 10, N), run(b, q, k, v, 10, N));
  const favor::DecoderState sa = a.state(), sb = b.state();
  EXPECT_EQ(sa.sums, sb.sums);
  EXPECT_EQ(sa.log_max, sb.log_max);
  EXPECT_EQ(sb.row_positions, std::vector<int64_t>(B, N));
}

TEST_P(DecoderStateIO, SelectEqualsDecoderOfReorderedBatch) {
  // Swap, repeat and drop rows after 10 tokens; the rest equals a decoder that saw the
  // reordered inputs from the start, bit for bit (heads are independent computations).
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{1, 0, 2}, {1, 0}, {2, 2, 0, 1}, {1}}) {
    Decoder a = make(B);
    run(a, q, k, v, 0, 10);
    a.select(rows);
    EXPECT_EQ(a.batch(), static_cast<int64_t>(rows.size()));
    const Tensor qr = batch_rows(q, rows), kr = batch_rows(k, rows), vr = batch_rows(v, rows);
    Decoder b = make(static_cast<int64_t>(rows.size()));
    run(b, qr, kr, vr, 0, 10);
    EXPECT_EQ(a.state().sums, b.state().sums);
    EXPECT_EQ(run(a, qr, kr, vr, 10, N), run(b, qr, kr, vr, 10, N)) << rows.size() << " rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Maps, DecoderStateIO,
                         ::testing::Values(MapCase{Kernel::positive, {}}, MapCase{Kernel::trig, {}},
                                           MapCase{Kernel::hyperbolic, {0.9}},
                                           MapCase{Kernel::favorpp, {0.95, 0.8}},
                                           MapCase{Kernel::positive, {0.9, 0.5}}),
                         [](const auto& info) {
                           return to_string(info.param.kernel) +
                                  (info.param.decay.empty() ? "" : "_decay") +
                                  std::to_string(info.index);
                         });

TEST(DecoderStateErrors, BadStatesNameTheField) {
  const int64_t B = 2, H = 2, D = 4, Dv = 3;
  const Projection w = Projection::draw(8, D);
  Decoder dec(B, H, Dv, w);
  dec.append(random_tensor({B, H, 2, D}, 1), random_tensor({B, H, 2, Dv}, 2));
  const favor::DecoderState good = dec.state();
  auto load = [&](auto edit) {
    return [&dec, good, edit] {
      favor::DecoderState s = good;
      edit(s);
      dec.load_state(s);
    };
  };
  expect_error(load([](favor::DecoderState& s) { s.batch = 3; }),
               "state.batch: 3 must equal the decoder's batch 2");
  expect_error(load([](favor::DecoderState& s) { s.features = 9; }), "state.features: 9");
  expect_error(load([](favor::DecoderState& s) { s.dv = 4; }), "state.dv: 4");
  expect_error(load([](favor::DecoderState& s) { s.sums.pop_back(); }),
               "state.sums: 127 values must be batch * heads * features * (dv + 1) = 128");
  expect_error(load([](favor::DecoderState& s) { s.log_max.push_back(0.0); }),
               "state.log_max: 5 values must be batch * heads = 4");
  expect_error(load([](favor::DecoderState& s) { s.row_positions = {2}; }),
               "state.row_positions: 1 values must be batch = 2");
  expect_error(load([](favor::DecoderState& s) { s.row_positions[1] = 3; }),
               "state.row_positions[1]: 3 must be in [0, position = 2]");
  expect_error(load([](favor::DecoderState& s) { s.position = -1; }), "state.position: -1");
  expect_error(load([](favor::DecoderState& s) { s.sums[5] = NAN; }), "state.sums[5]");
  expect_error(load([](favor::DecoderState& s) { s.log_max[2] = NAN; }),
               "state.log_max[2]: nan must be finite or -inf");
  expect_error(load([](favor::DecoderState& s) { s.log_max[1] = -INFINITY; }),
               "state.sums: head 1 has log_max -inf");
  // A failed load leaves the state as it was.
  EXPECT_EQ(dec.state().sums, good.sums);
  EXPECT_EQ(dec.position(), 2);

  expect_error([&] { dec.select({0, 2}); }, "indices[1]: 2 must be in [0, batch = 2)");
  expect_error([&] { dec.select({-1}); }, "indices[0]: -1");
  expect_error([&] { dec.select({}); }, "indices: empty");
  EXPECT_EQ(dec.batch(), 2);
}

TEST(DecoderStateErrors, SelectRefusesPerRowMapParameters) {
  // A fit of batch * heads heads gives each (batch, head) its own projection: reordering the
  // batch would pair rows with other rows' parameters.
  const int64_t B = 2, H = 2, D = 4;
  KernelFit fit;
  fit.heads = B * H;
  fit.d = D;
  fit.a.assign(static_cast<size_t>(B * H * D), -0.1);
  fit.basis.assign(static_cast<size_t>(B * H * D * D), 0.0);
  for (int64_t g = 0; g < B * H; ++g)
    for (int64_t l = 0; l < D; ++l) fit.basis[static_cast<size_t>((g * D + l) * D + l)] = 1.0;
  Decoder dec(B, H, 3, Projection::draw(8, D), {Kernel::favorpp, std::nullopt, fit});
  expect_error([&] { dec.select({1, 0}); }, "indices: the decoder's map has per-(batch, head)");
  // Learned parameters per (batch, head) too.
  const FeatureMap learned =
      testing::random_map(Kernel::positive, Projection::draw(8, D), {B * H, true, false, false}, 3);
  Decoder per_row(B, H, 3, learned);
  expect_error([&] { per_row.select({0, 1}); }, "indices: the decoder's map has per-(batch");
  // A batch of one has nothing to mix up.
  KernelFit one = fit;
  one.heads = H;
  one.a.resize(static_cast<size_t>(H * D));
  one.basis.resize(static_cast<size_t>(H * D * D));
  Decoder single(1, H, 3, Projection::draw(8, D), {Kernel::favorpp, std::nullopt, one});
  single.select({0, 0});
  EXPECT_EQ(single.batch(), 2);
}

TEST(DecoderStateIO, AFitPerHeadFollowsABeamReorder) {
  // A FAVOR++ fit of H heads (one per head, fitted on [1, H, N, D] calibration data) serves
  // every batch row: select reorders the state, and the next step equals a decoder of the
  // reordered batch bit for bit (a beam search of a FAVOR++ / FAVOR# model).
  const int64_t B = 2, H = 2, D = 4, Dv = 3, T = 5;
  KernelFit fit;
  fit.heads = H;
  fit.d = D;
  fit.a = {-0.05, -0.1, 0.02, 0.0, -0.2, 0.01, -0.03, 0.05};
  fit.basis.assign(static_cast<size_t>(H * D * D), 0.0);
  for (int64_t g = 0; g < H; ++g)
    for (int64_t l = 0; l < D; ++l) fit.basis[static_cast<size_t>((g * D + l) * D + l)] = 1.0;
  const Projection w = Projection::draw(8, D);
  const Tensor k = random_tensor({B, H, T, D}, 71), v = random_tensor({B, H, T, Dv}, 72);
  const std::vector<int64_t> rows = {1, 0, 1};
  auto reordered = [&](const Tensor& x) {  // batch rows `rows` of x
    const Shape4 sh = x.shape();
    Tensor out({int64_t(rows.size()), sh[1], sh[2], sh[3]});
    const int64_t per_row = sh[1] * sh[2] * sh[3];
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy_n(x.data() + rows[r] * per_row, per_row, out.data() + int64_t(r) * per_row);
    return out;
  };
  Decoder dec(B, H, Dv, w, {Kernel::favorpp, std::nullopt, fit});
  dec.append(k, v);
  dec.select(rows);
  Decoder ref(3, H, Dv, w, {Kernel::favorpp, std::nullopt, fit});
  ref.append(reordered(k), reordered(v));
  const Tensor q1 = random_tensor({3, H, 1, D}, 73), k1 = random_tensor({3, H, 1, D}, 74),
               v1 = random_tensor({3, H, 1, Dv}, 75);
  EXPECT_EQ(dec.step(q1, k1, v1).values(), ref.step(q1, k1, v1).values());
  KernelFit three = fit;  // 3 sets: neither 1, H nor B * H
  three.heads = 3;
  three.a.resize(static_cast<size_t>(3 * D), -0.1);
  three.basis.resize(static_cast<size_t>(3 * D * D), 0.0);
  expect_error([&] { Decoder(B, H, Dv, w, {Kernel::favorpp, std::nullopt, three}); },
               "fit: the fit has 3 heads");
}

class VQDecoderStateIO : public ::testing::TestWithParam<double> {
 protected:
  VQDecoder make(int64_t batch) const {
    return VQDecoder(batch, H, Dv, codebook, {std::nullopt, GetParam()});
  }
  static constexpr int64_t B = 3, H = 2, N = 24, D = 8, Dv = 5, c = 7;
  const Tensor q = random_tensor({B, H, N, D}, 61), k = random_tensor({B, H, N, D}, 62),
               v = random_tensor({B, H, N, Dv}, 63), codebook = random_tensor({1, H, c, D}, 64);
};

TEST_P(VQDecoderStateIO, ExportImportContinuesBitIdentical) {
  VQDecoder a = make(B);
  run(a, q, k, v, 0, 10);
  VQDecoder b = make(B);
  EXPECT_NE(b.query(tokens(q, 10)).values(), a.query(tokens(q, 10)).values());
  b.load_state(a.state());
  EXPECT_EQ(b.position(), 10);
  EXPECT_EQ(run(a, q, k, v, 10, N), run(b, q, k, v, 10, N));
  EXPECT_EQ(a.state().counts, b.state().counts);
}

TEST_P(VQDecoderStateIO, SelectEqualsDecoderOfReorderedBatch) {
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{1, 0, 2}, {1, 0}, {2, 2, 0, 1}, {1}}) {
    VQDecoder a = make(B);
    run(a, q, k, v, 0, 10);
    a.select(rows);
    EXPECT_EQ(a.batch(), static_cast<int64_t>(rows.size()));
    const Tensor qr = batch_rows(q, rows), kr = batch_rows(k, rows), vr = batch_rows(v, rows);
    VQDecoder b = make(static_cast<int64_t>(rows.size()));
    run(b, qr, kr, vr, 0, 10);
    EXPECT_EQ(a.state().sums, b.state().sums);
    EXPECT_EQ(run(a, qr, kr, vr, 10, N), run(b, qr, kr, vr, 10, N)) << rows.size() << " rows";
  }
}

INSTANTIATE_TEST_SUITE_P(HardAndSoft, VQDecoderStateIO, ::testing::Values(0.0, 0.5),
                         [](const auto& info) { return info.param > 0 ? "soft" : "hard"; });

TEST(VQDecoderStateErrors, BadStatesNameTheField) {
  const int64_t B = 2, H = 1, D = 4, Dv = 3, c = 5;
  VQDecoder dec(B, H, Dv, random_tensor({1, 1, c, D}, 3));
  dec.append(random_tensor({B, H, 2, D}, 1), random_tensor({B, H, 2, Dv}, 2));
  const VQDecoderState good = dec.state();
  auto load = [&](auto edit) {
    return [&dec, good, edit] {
      VQDecoderState s = good;
      edit(s);
      dec.load_state(s);
    };
  };
  expect_error(load([](VQDecoderState& s) { s.heads = 2; }),
               "state.heads: 2 must equal the decoder's heads 1");
  expect_error(load([](VQDecoderState& s) { s.codes = 4; }), "state.codes: 4");
  expect_error(load([](VQDecoderState& s) { s.sums.push_back(0.0f); }),
               "state.sums: 31 values must be batch * heads * codes * dv = 30");
  expect_error(load([](VQDecoderState& s) { s.counts.pop_back(); }),
               "state.counts: 9 values must be batch * heads * codes = 10");
  expect_error(load([](VQDecoderState& s) { s.counts[3] = -1.0f; }),
               "state.counts[3]: -1.000000 must be >= 0");
  expect_error(load([](VQDecoderState& s) { s.sums[0] = INFINITY; }), "state.sums[0]");
  expect_error(load([](VQDecoderState& s) { s.position = -2; }), "state.position: -2");
  EXPECT_EQ(dec.state().counts, good.counts);
  expect_error([&] { dec.select({3}); }, "indices[0]: 3 must be in [0, batch = 2)");
}

}  // namespace
}  // namespace favor
