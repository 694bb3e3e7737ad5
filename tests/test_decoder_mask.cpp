// append(k, v, key_mask): a masked token adds no key. A masked batch (left padding, or masks
// inside the sequence) equals causal favor_attention with that key mask, decay included (a
// row's clock counts every token from its first kept one: a masked token after it decays
// the state as the distance i - j of the op's decay says; left padding does not); without
// decay it also equals, bit for bit, each row's kept tokens appended alone in the same
// groups.
#include <gtest/gtest.h>

#include "map_fixture.hpp"
#include "test_helpers.hpp"

namespace favor {
namespace {
using testing::expect_error;
using testing::random_tensor;
using testing::tokens;

/// The kept tokens (mask[b * N + j] != 0) of batch row b of a [B, H, N, X] tensor, as
/// [1, H, kept, X]; all N tokens when keep_all.
Tensor kept_row(const Tensor& t, int64_t b, const std::vector<uint8_t>& mask, bool keep_all) {
  const Shape4 s = t.shape();
  std::vector<int64_t> js;
  for (int64_t j = 0; j < s[2]; ++j)
    if (keep_all || mask[static_cast<size_t>(b * s[2] + j)]) js.push_back(j);
  Tensor out({1, s[1], static_cast<int64_t>(js.size()), s[3]});
  for (int64_t h = 0; h < s[1]; ++h)
    for (size_t i = 0; i < js.size(); ++i)
      for (int64_t x = 0; x < s[3]; ++x)
        out.at(0, h, static_cast<int64_t>(i), x) = t.at(b, h, js[i], x);
  return out;
}

/// Appends all N tokens in groups (sizes `groups`, then single tokens) with the mask, and
/// each row's kept tokens alone in the same groups; after each group both query the group's
/// last token. Expects every row bit-identical to its decoder alone; returns the masked
/// decoder's outputs at the queried rows (the others zero) and those rows in *queried.
template <class D, class Make>
Tensor masked_vs_rows_alone(Make make, const Tensor& q, const Tensor& k, const Tensor& v,
                            const std::vector<uint8_t>& mask, const std::vector<int64_t>& groups,
                            std::vector<int64_t>* queried, bool compare_alone = true) {
  const int64_t B = q.shape()[0], H = q.shape()[1], N = q.shape()[2], Dv = v.shape()[3];
  const KeyMaskView full = KeyMaskView::contiguous(mask.data(), B, N);
  D dec = make(B);
  std::vector<D> alone;
  std::vector<Tensor> qb, kb, vb;
  std::vector<int64_t> done(static_cast<size_t>(B), 0);  // kept tokens appended per row
  for (int64_t b = 0; b < B; ++b) {
    alone.push_back(make(1));
    qb.push_back(kept_row(q, b, mask, true));
    kb.push_back(kept_row(k, b, mask, false));
    vb.push_back(kept_row(v, b, mask, false));
  }
  Tensor out({B, H, N, Dv});
  int64_t mismatches = 0;
  queried->clear();
  for (size_t g = 0, first = 0; static_cast<int64_t>(first) < N; ++g) {
    const int64_t T = g < groups.size() ? groups[g] : 1, i0 = static_cast<int64_t>(first);
    const KeyMaskView m{mask.data() + i0, B, T, N, 1};
    dec.append(tokens(k, i0, T), tokens(v, i0, T), m);
    const int64_t last = i0 + T - 1;
    const Tensor y = dec.query(tokens(q, last));
    for (int64_t b = 0; b < B; ++b) {
      int64_t n = 0;
      for (int64_t j = i0; j <= last; ++j) n += full.at(b, j) ? 1 : 0;
      auto& row = alone[static_cast<size_t>(b)];
      if (n > 0) {
        const auto at = done[static_cast<size_t>(b)];
        row.append(tokens(kb[static_cast<size_t>(b)], at, n),
                   tokens(vb[static_cast<size_t>(b)], at, n));
      }
      done[static_cast<size_t>(b)] += n;
      const Tensor yb = row.query(tokens(qb[static_cast<size_t>(b)], last));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t x = 0; x < Dv; ++x) {
          out.at(b, h, last, x) = y.at(b, h, 0, x);
          mismatches += y.at(b, h, 0, x) != yb.at(0, h, 0, x);
        }
    }
    queried->push_back(last);
    first += static_cast<size_t>(T);
  }
  if (compare_alone) EXPECT_EQ(mismatches, 0) << "outputs that differ from the rows appended alone";
  EXPECT_EQ(dec.position(), N);
  return out;
}

/// v with its masked tokens scaled by 1e3: a masked token that leaked into a state would
/// dominate that row's output.
Tensor loud(const Tensor& v, const std::vector<uint8_t>& mask) {
  Tensor out = v;
  const Shape4 s = v.shape();
  for (int64_t b = 0; b < s[0]; ++b)
    for (int64_t h = 0; h < s[1]; ++h)
      for (int64_t j = 0; j < s[2]; ++j)
        if (!mask[static_cast<size_t>(b * s[2] + j)])
          for (int64_t x = 0; x < s[3]; ++x) out.at(b, h, j, x) *= 1e3f;
  return out;
}

constexpr int64_t B = 3, H = 2, N = 40, D = 8, Dv = 5;
const std::vector<int64_t> kPads{0, 5, 17};

/// Left padding: row b's first kPads[b] tokens are masked.
std::vector<uint8_t> left_padding() {
  std::vector<uint8_t> mask(static_cast<size_t>(B * N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < N; ++j) mask[static_cast<size_t>(b * N + j)] = j >= kPads[size_t(b)];
  return mask;
}

/// Masks inside the sequence: row b drops every (b + 2)-th token, and row 0 a run of 6.
std::vector<uint8_t> holes() {
  std::vector<uint8_t> mask(static_cast<size_t>(B * N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < N; ++j)
      mask[static_cast<size_t>(b * N + j)] = j % (b + 2) != 1 && !(b == 0 && j >= 20 && j < 26);
  return mask;
}

// Groups: all single tokens; a prefill that holds one kept token of row 1 and none of row
// 2, a group with no kept token of row 2, then a group of 7; a prefill of everything.
const std::vector<std::vector<int64_t>> kGroups{{}, {6, 11, 1, 7}, {N}};

struct MaskCase {
  Kernel kernel;
  std::vector<double> decay;
};

class DecoderKeyMask : public ::testing::TestWithParam<MaskCase> {
 protected:
  FeatureMap map() const {
    const Projection w = Projection::draw(24, D, {ProjectionKind::orthogonal, NormMode::chi, 6});
    FeatureMap m(w, GetParam().kernel);
    if (data_adapted(GetParam().kernel)) m.fit = KernelFit::constant(-0.1, D);
    return m;
  }
  Decoder make(int64_t batch) const {
    DecoderOptions o;
    o.decay = GetParam().decay;
    return Decoder(batch, H, Dv, map(), o);
  }
  const Tensor q = random_tensor({B, H, N, D}, 71, 1.5), k = random_tensor({B, H, N, D}, 72, 1.5),
               v = random_tensor({B, H, N, Dv}, 73);
};

TEST_P(DecoderKeyMask, LeftPaddedEqualsRowsAloneAndCausalAttention) {
  const std::vector<uint8_t> mask = left_padding();
  const Tensor vl = loud(v, mask);
  AttentionOptions o;
  o.causal = true;
  o.decay = GetParam().decay;
  o.key_mask = KeyMaskView::contiguous(mask.data(), B, N);
  const Tensor batch = favor_attention(q, k, vl, map(), o);
  for (const auto& groups : kGroups) {
    std::vector<int64_t> rows;
    const Tensor y = masked_vs_rows_alone<Decoder>([&](int64_t b) { return make(b); }, q, k, vl,
                                                   mask, groups, &rows);
    // As test_streaming.cpp: two float32 evaluations of one formula, 1e-5 relative.
    EXPECT_LE(testing::rows_rel_error(y, batch, rows), 1e-5) << groups.size() << " groups";
    // Row 2 before its first kept token (17) has no key: zeros, as in the batch kernel.
    if (std::find(rows.begin(), rows.end(), 5) != rows.end()) EXPECT_EQ(y.at(2, 0, 5, 0), 0.0f);
  }
}

TEST_P(DecoderKeyMask, HolesEqualCausalAttention) {
  // Masked tokens in the middle add no key; with decay they tick the row's clock (the
  // distance the op's decay measures), so every grouping of appends equals causal
  // favor_attention with the mask; without decay the row also equals its kept tokens appended
  // alone, bit for bit. The clock counts every token from the row's first kept one.
  const std::vector<uint8_t> mask = holes();
  const Tensor vl = loud(v, mask);
  AttentionOptions o;
  o.causal = true;
  o.decay = GetParam().decay;
  o.key_mask = KeyMaskView::contiguous(mask.data(), B, N);
  const Tensor batch = favor_attention(q, k, vl, map(), o);
  for (const auto& groups : kGroups) {
    std::vector<int64_t> rows;
    const Tensor y = masked_vs_rows_alone<Decoder>([&](int64_t b) { return make(b); }, q, k, vl,
                                                   mask, groups, &rows, GetParam().decay.empty());
    EXPECT_LE(testing::rows_rel_error(y, batch, rows), 1e-5) << groups.size() << " groups";
  }
  Decoder dec = make(B);
  dec.append(k, v, KeyMaskView::contiguous(mask.data(), B, N));
  std::vector<int64_t> clock(B, 0);
  for (int64_t b = 0; b < B; ++b) {
    int64_t first = 0;
    while (first < N && !mask[size_t(b * N + first)]) ++first;
    clock[size_t(b)] = N - first;
  }
  EXPECT_EQ(dec.state().row_positions, clock);
  EXPECT_EQ(dec.position(), N);
}

INSTANTIATE_TEST_SUITE_P(
    Maps, DecoderKeyMask,
    ::testing::Values(MaskCase{Kernel::positive, {}}, MaskCase{Kernel::trig, {}},
                      MaskCase{Kernel::hyperbolic, {}}, MaskCase{Kernel::positive, {0.9, 0.5}},
                      MaskCase{Kernel::favorpp, {0.95}}),
    [](const auto& info) {
      return to_string(info.param.kernel) + (info.param.decay.empty() ? "" : "_decay");
    });

TEST(DecoderKeyMaskErrors, MaskShapeNamesTheArgument) {
  Decoder dec(2, 1, 3, Projection::draw(8, 4));
  const Tensor k = random_tensor({2, 1, 3, 4}, 1), v = random_tensor({2, 1, 3, 3}, 2);
  const std::vector<uint8_t> mask(6, 1);
  expect_error([&] { dec.append(k, v, KeyMaskView::contiguous(mask.data(), 2, 2)); },
               "key_mask: shape [2,2] must be [B, T] = [2,3]");
  expect_error([&] { dec.append(k, v, KeyMaskView{mask.data(), 2, 3, -3, 1}); },
               "key_mask: strides must be non-negative");
  EXPECT_EQ(dec.position(), 0);
}

class VQDecoderKeyMask : public ::testing::TestWithParam<double> {
 protected:
  VQDecoder make(int64_t batch) const {
    return VQDecoder(batch, H, Dv, codebook, {std::nullopt, GetParam()});
  }
  const Tensor q = random_tensor({B, H, N, D}, 81), k = random_tensor({B, H, N, D}, 82),
               v = random_tensor({B, H, N, Dv}, 83), codebook = random_tensor({1, H, 7, D}, 84);
};

TEST_P(VQDecoderKeyMask, MaskedEqualsRowsAlone) {
  for (const std::vector<uint8_t>& mask : {left_padding(), holes()}) {
    for (const auto& groups : kGroups) {
      std::vector<int64_t> rows;
      masked_vs_rows_alone<VQDecoder>([&](int64_t b) { return make(b); }, q, k, loud(v, mask), mask,
                                      groups, &rows);
    }
  }
  VQDecoder dec = make(B);
  const std::vector<uint8_t> mask(static_cast<size_t>(B * 2), 1);
  expect_error([&] { dec.append(k, v, KeyMaskView::contiguous(mask.data(), B, 2)); },
               "key_mask: shape [3,2] must be [B, T] = [3,40]");
}

INSTANTIATE_TEST_SUITE_P(HardAndSoft, VQDecoderKeyMask, ::testing::Values(0.0, 0.5),
                         [](const auto& info) { return info.param > 0 ? "soft" : "hard"; });

}  // namespace
}  // namespace favor
