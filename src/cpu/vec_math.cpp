// Highway compiles this file once per SIMD target (foreach_target) and dispatches to the
// best one the CPU supports, so one binary runs everywhere and uses AVX-512 where present.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/vec_math.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "cpu/exp_or_inf-inl.h"

HWY_BEFORE_NAMESPACE();
namespace favor::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
// Tails go through a lane-sized stack buffer: 64 floats cover every x86 vector width.
constexpr int64_t kTailLanes = 64;

template <class Op>
HWY_INLINE void unary_rows(const float* HWY_RESTRICT in, float* HWY_RESTRICT out, int64_t n,
                           Op op) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(op(d, hn::LoadU(d, in + i)), d, out + i);
  if (i < n) {
    HWY_ALIGN float buf[kTailLanes] = {0};
    for (int64_t j = i; j < n; ++j) buf[j - i] = in[j];
    hn::Store(op(d, hn::Load(d, buf)), d, buf);
    for (int64_t j = i; j < n; ++j) out[j] = buf[j - i];
  }
}

void ExpAffine(const float* in, float sign, float offset, float* out, int64_t n) {
  unary_rows(in, out, n, [sign, offset](const DF d, auto v) HWY_ATTR {
    return ExpOrInf(d, hn::MulAdd(v, hn::Set(d, sign), hn::Set(d, offset)));
  });
}

void LogOrNegInf(const float* in, float* out, int64_t n) {
  unary_rows(in, out, n, [](const DF d, auto v) HWY_ATTR {
    const auto positive = hn::Ge(v, hn::Set(d, std::numeric_limits<float>::min()));
    const auto safe = hn::IfThenElse(positive, v, hn::Set(d, 1.0f));
    return hn::IfThenElse(positive, hn::Log(d, safe),
                          hn::Set(d, -std::numeric_limits<float>::infinity()));
  });
}

void ExpShiftLive(const float* a, float sign, float c, const float* log_s, float* out, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, sign), shift = hn::Set(d, -c);
  const auto ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = ExpOrInf(d, hn::MulAdd(hn::LoadU(d, a + i), s, shift));
    hn::StoreU(hn::IfThenElseZero(hn::Gt(hn::LoadU(d, log_s + i), ninf), e), d, out + i);
  }
  for (; i < n; ++i)
    out[i] = log_s[i] > -std::numeric_limits<float>::infinity() ? std::exp(sign * a[i] - c) : 0.0f;
}

// max_i (sign * a[i] + log p[i]) over the p[i] >= FLT_MIN, as MaxOfSignedSum after
// LogOrNegInf, to the bit: Mitchell's bound log p >= ln 2 (bits(p) - bits(1)) / 2^23 (within
// 0.06 below log p for normal p) finds the lanes that can attain the max, and Highway's log
// runs only on vectors that hold one. The tail goes through padded buffers (p = 0: dead), so
// every lane's exact value is the one LogOrNegInf gives it.
float MaxOfSignedSumLog(const float* a, float sign, const float* p, int64_t n) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const float ninf_s = -std::numeric_limits<float>::infinity();
  const auto s = hn::Set(d, sign), ninf = hn::Set(d, ninf_s), one = hn::Set(d, 1.0f);
  const auto tiny = hn::Set(d, std::numeric_limits<float>::min());
  const auto one_bits = hn::Set(di, 0x3f800000);
  const auto ln2_ulp = hn::Set(d, 0.693147181f / 8388608.0f);  // ln 2 / 2^23
  const int64_t full = n - n % lanes;
  HWY_ALIGN float ta[kTailLanes] = {0}, tp[kTailLanes] = {0};
  for (int64_t i = full; i < n; ++i) {
    ta[i - full] = a[i];
    tp[i - full] = p[i];
  }
  const auto a_at = [&](int64_t i) { return i < full ? hn::LoadU(d, a + i) : hn::Load(d, ta); };
  const auto p_at = [&](int64_t i) { return i < full ? hn::LoadU(d, p + i) : hn::Load(d, tp); };
  const auto exact = [&](auto va, auto vp) {
    const auto live = hn::Ge(vp, tiny);
    return hn::MulAdd(va, s, hn::IfThenElse(live, hn::Log(d, hn::IfThenElse(live, vp, one)), ninf));
  };
  // Pass 1: the bounds (kept for pass 2 when n fits the buffer) and their max.
  constexpr int64_t kKept = 1024;
  HWY_ALIGN float kept[kKept + kTailLanes];
  auto lower = ninf, top = ninf;
  for (int64_t i = 0; i < n; i += lanes) {
    const auto va = a_at(i), vp = p_at(i);
    const auto approx = hn::Mul(hn::ConvertTo(d, hn::Sub(hn::BitCast(di, vp), one_bits)), ln2_ulp);
    const auto bound = hn::IfThenElse(hn::Ge(vp, tiny), hn::MulAdd(va, s, approx), ninf);
    if (n <= kKept) hn::Store(bound, d, kept + i);
    lower = hn::Max(lower, bound);
    top = hn::Max(top, vp);
  }
  const float low = hn::GetLane(hn::MaxOfLanes(d, lower));
  auto best = ninf;
  if (!(low > ninf_s)) return ninf_s;  // every p dead: every term is -inf
  if (n > kKept || !std::isfinite(low) || !(hn::GetLane(hn::MaxOfLanes(d, top)) <= 3.0e38f)) {
    for (int64_t i = 0; i < n; i += lanes) best = hn::Max(best, exact(a_at(i), p_at(i)));
    return hn::GetLane(hn::MaxOfLanes(d, best));
  }
  // Pass 2: a lane whose bound is below low - 0.0597 (plus the roundings) is below the max.
  const auto bar = hn::Set(d, low - (0.125f + std::abs(low) * 0x1p-10f));
  for (int64_t i = 0; i < n; i += lanes) {
    const auto candidate = hn::Ge(hn::Load(d, kept + i), bar);
    if (!hn::AllFalse(d, candidate))
      best = hn::Max(best, hn::IfThenElse(candidate, exact(a_at(i), p_at(i)), ninf));
  }
  return hn::GetLane(hn::MaxOfLanes(d, best));
}

// ExpShiftLive with the liveness of the key sums themselves: out[i] = exp(sign a[i] - c)
// where p[i] >= FLT_MIN (where LogOrNegInf gives log p > -inf), else 0.
void ExpShiftLiveSums(const float* a, float sign, float c, const float* p, float* out, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, sign), shift = hn::Set(d, -c);
  const auto tiny = hn::Set(d, std::numeric_limits<float>::min());
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = ExpOrInf(d, hn::MulAdd(hn::LoadU(d, a + i), s, shift));
    hn::StoreU(hn::IfThenElseZero(hn::Ge(hn::LoadU(d, p + i), tiny), e), d, out + i);
  }
  for (; i < n; ++i)
    out[i] = p[i] >= std::numeric_limits<float>::min() ? std::exp(sign * a[i] - c) : 0.0f;
}

void ExpAffinePlus(const float* a, float sign, float offset, const float* b, float* out,
                   int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto s = hn::Set(d, sign), off = hn::Set(d, offset);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto x = hn::Add(hn::MulAdd(hn::LoadU(d, a + i), s, off), hn::LoadU(d, b + i));
    hn::StoreU(ExpOrInf(d, x), d, out + i);
  }
  for (; i < n; ++i) out[i] = std::exp(sign * a[i] + offset + b[i]);
}

float MaxOfSignedSum(const float* a, float sign, const float* b, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto ninf = hn::Set(d, -std::numeric_limits<float>::infinity());
  const auto s = hn::Set(d, sign);
  auto acc = ninf;
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    acc = hn::Max(acc, hn::MulAdd(hn::LoadU(d, a + i), s, hn::LoadU(d, b + i)));
  }
  float best = hn::GetLane(hn::MaxOfLanes(d, acc));
  for (; i < n; ++i) best = std::max(best, sign * a[i] + b[i]);
  return best;
}

float MaxValue(const float* a, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Set(d, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::Max(acc, hn::LoadU(d, a + i));
  float best = hn::GetLane(hn::MaxOfLanes(d, acc));
  for (; i < n; ++i) best = std::max(best, a[i]);
  return best;
}

float MinValue(const float* a, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Set(d, std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::Min(acc, hn::LoadU(d, a + i));
  float best = hn::GetLane(hn::MinOfLanes(d, acc));
  for (; i < n; ++i) best = std::min(best, a[i]);
  return best;
}

double ScaleCopyNorm2(const float* src, float mult, float* dst, int64_t n) {
  // Half-width float vectors promoted to full-width doubles: the sum of squares is exact
  // to double rounding (large norms enter the key exponent as -|y|^2/2).
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(dd));
  const auto m = hn::Set(df, mult);
  auto acc = hn::Zero(dd);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::Mul(hn::LoadU(df, src + i), m);
    hn::StoreU(v, df, dst + i);
    const auto w = hn::PromoteTo(dd, v);
    acc = hn::MulAdd(w, w, acc);
  }
  double sum = hn::GetLane(hn::SumOfLanes(dd, acc));
  for (; i < n; ++i) {
    dst[i] = mult * src[i];
    sum += static_cast<double>(dst[i]) * dst[i];
  }
  return sum;
}

void ScaleCopy(const float* src, float mult, float* dst, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto m = hn::Set(d, mult);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, src + i), m), d, dst + i);
  for (; i < n; ++i) dst[i] = mult * src[i];
}

// out = prev * f + add, rounded twice (multiply, then add) as the scalar loops it replaces.
void ScaleAdd(const float* prev, float f, const float* add, float* out, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vf = hn::Set(d, f);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto product = hn::Mul(hn::LoadU(d, prev + i), vf);
    hn::StoreU(hn::Add(product, hn::LoadU(d, add + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = prev[i] * f + add[i];
}

bool ScaleCopyFinite(const float* src, float mult, float* dst, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto m = hn::Set(d, mult);
  auto finite = hn::Eq(m, m);  // all true
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::Mul(hn::LoadU(d, src + i), m);
    finite = hn::And(finite, hn::IsFinite(v));
    hn::StoreU(v, d, dst + i);
  }
  bool ok = hn::AllTrue(d, finite);
  for (; i < n; ++i) {
    dst[i] = mult * src[i];
    ok = ok && std::isfinite(dst[i]);
  }
  return ok;
}

void KeyRowScales(const float* prefix, float e, const float* inv_sigma, float* dphi, float* phi,
                  float* kscaled, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto ve = hn::Set(d, e), one = hn::Set(d, 1.0f);
  const auto tiny = hn::Set(d, std::numeric_limits<float>::min());
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto inv = hn::LoadU(d, inv_sigma + i), vphi = hn::LoadU(d, phi + i);
    auto pj = one;
    if (prefix) {
      const auto p = hn::LoadU(d, prefix + i);
      pj = hn::IfThenElse(hn::Lt(p, tiny), tiny, p);  // std::max(p, FLT_MIN)
    }
    hn::StoreU(hn::Mul(hn::LoadU(d, dphi + i), hn::Mul(hn::Mul(pj, ve), inv)), d, dphi + i);
    hn::StoreU(hn::Mul(hn::Mul(vphi, ve), inv), d, kscaled + i);
    if (prefix) hn::StoreU(hn::Mul(vphi, hn::Div(one, pj)), d, phi + i);
  }
  for (; i < n; ++i) {
    const float pj = prefix ? std::max(prefix[i], std::numeric_limits<float>::min()) : 1.0f;
    dphi[i] *= (pj * e) * inv_sigma[i];
    kscaled[i] = (phi[i] * e) * inv_sigma[i];
    if (prefix) phi[i] *= 1.0f / pj;
  }
}

void AddFlooredProduct(const float* p, const float* b, float* out, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto tiny = hn::Set(d, std::numeric_limits<float>::min());
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto vp = hn::LoadU(d, p + i);
    const auto floored = hn::IfThenElse(hn::Lt(vp, tiny), tiny, vp);  // std::max(p, FLT_MIN)
    hn::StoreU(hn::Add(hn::LoadU(d, out + i), hn::Mul(floored, hn::LoadU(d, b + i))), d, out + i);
  }
  for (; i < n; ++i) out[i] += std::max(p[i], std::numeric_limits<float>::min()) * b[i];
}

void MulScaled(const float* a, const float* b, float e, float* out, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto ve = hn::Set(d, e);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::Mul(hn::LoadU(d, a + i), hn::Mul(hn::LoadU(d, b + i), ve)), d, out + i);
  for (; i < n; ++i) out[i] = a[i] * (b[i] * e);
}

bool UpstreamRow(const float* num, float den, const float* dy, float* g, int64_t dv) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vden = hn::Set(d, den);
  auto finite = hn::Eq(vden, vden);
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= dv; i += lanes) {
    const auto y = hn::Div(hn::LoadU(d, num + i), vden), vdy = hn::LoadU(d, dy + i);
    finite = hn::And(finite, hn::IsFinite(y));
    acc = hn::MulAdd(vdy, y, acc);
    hn::StoreU(hn::Div(vdy, vden), d, g + i);
  }
  bool ok = hn::AllTrue(d, finite);
  float dot = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < dv; ++i) {
    const float y = num[i] / den;
    ok = ok && std::isfinite(y);
    dot += dy[i] * y;
    g[i] = dy[i] / den;
  }
  g[dv] = -dot / den;
  return ok;
}

float SumValues(const float* a, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) acc = hn::Add(acc, hn::LoadU(d, a + i));
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += a[i];
  return sum;
}

float Dot(const float* a, const float* b, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    acc = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), acc);
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Four rows at a time share each load of x (a decode step's keys against one query).
void RowDots(const float* A, int64_t rows, int64_t n, const float* x, float mult, float* out) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), whole = n - n % lanes;
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const float *a0 = A + r * n, *a1 = a0 + n, *a2 = a1 + n, *a3 = a2 + n;
    auto c0 = hn::Zero(d), c1 = hn::Zero(d), c2 = hn::Zero(d), c3 = hn::Zero(d);
    for (int64_t i = 0; i < whole; i += lanes) {
      const auto xv = hn::LoadU(d, x + i);
      c0 = hn::MulAdd(hn::LoadU(d, a0 + i), xv, c0);
      c1 = hn::MulAdd(hn::LoadU(d, a1 + i), xv, c1);
      c2 = hn::MulAdd(hn::LoadU(d, a2 + i), xv, c2);
      c3 = hn::MulAdd(hn::LoadU(d, a3 + i), xv, c3);
    }
    float s[4] = {hn::GetLane(hn::SumOfLanes(d, c0)), hn::GetLane(hn::SumOfLanes(d, c1)),
                  hn::GetLane(hn::SumOfLanes(d, c2)), hn::GetLane(hn::SumOfLanes(d, c3))};
    for (int64_t i = whole; i < n; ++i) {
      s[0] += a0[i] * x[i];
      s[1] += a1[i] * x[i];
      s[2] += a2[i] * x[i];
      s[3] += a3[i] * x[i];
    }
    for (int k = 0; k < 4; ++k) out[r + k] = mult * s[k];
  }
  for (; r < rows; ++r) out[r] = mult * Dot(A + r * n, x, n);
}

// out[:] += c * x[:] over n floats.
HWY_INLINE void Axpy(float c, const float* HWY_RESTRICT x, float* HWY_RESTRICT out, int64_t n) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto cv = hn::Set(d, c);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes)
    hn::StoreU(hn::MulAdd(cv, hn::LoadU(d, x + i), hn::LoadU(d, out + i)), d, out + i);
  for (; i < n; ++i) out[i] += c * x[i];
}

void Rank1Update(float* S, const float* phi, const float* v, int64_t F, int64_t dv) {
  for (int64_t f = 0; f < F; ++f) Axpy(phi[f], v, S + f * dv, dv);
}

// Columns [i, i + R lanes) of TransposedMatvec with y in registers, and with them (tail > 0)
// the `tail` columns after them through Axpy's scalar loop: per element the same sum over f
// in the same order as an Axpy per row into y (the same bits), without y's load and store
// per row, whose store-to-load chain and call per row made the old loop ~5x slower than
// its loads (a decoder's query over 256 x 65 floats, perf, issue 27).
template <int R>
HWY_INLINE void TransposedMatvecBlock(const float* S, const float* phi, int64_t F, int64_t dv,
                                      int64_t i, int64_t tail, float* y) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  using V = decltype(hn::Zero(d));
  V acc[R > 0 ? R : 1];
  for (int r = 0; r < R; ++r) acc[r] = hn::Zero(d);
  const int64_t t0 = i + R * lanes;
  for (int64_t x = t0; x < t0 + tail; ++x) y[x] = 0.0f;
  for (int64_t f = 0; f < F; ++f) {
    const float* row = S + f * dv + i;
    const auto c = hn::Set(d, phi[f]);
    for (int r = 0; r < R; ++r) acc[r] = hn::MulAdd(c, hn::LoadU(d, row + r * lanes), acc[r]);
    if (tail > 0) Axpy(phi[f], S + f * dv + t0, y + t0, tail);
  }
  for (int r = 0; r < R; ++r) hn::StoreU(acc[r], d, y + i + r * lanes);
}

// Calls block(std::integral_constant<int, R>(), i, tail) over the columns of a row of dv
// floats: blocks of R = 4 vectors from column i, then the last block (R = 0..4 vectors) with
// the `tail` columns after its vectors (TransposedMatvec, UpdateAndRead).
template <class Block>
HWY_INLINE void ForColumnBlocks(int64_t dv, const Block& block) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t vectors = dv / lanes, tail = dv - vectors * lanes;
  int64_t left = vectors, i = 0;
  for (; left > 4; left -= 4, i += 4 * lanes) block(std::integral_constant<int, 4>(), i, 0);
  switch (left) {
    case 4:
      block(std::integral_constant<int, 4>(), i, tail);
      break;
    case 3:
      block(std::integral_constant<int, 3>(), i, tail);
      break;
    case 2:
      block(std::integral_constant<int, 2>(), i, tail);
      break;
    case 1:
      block(std::integral_constant<int, 1>(), i, tail);
      break;
    default:
      block(std::integral_constant<int, 0>(), i, tail);
      break;
  }
}

void TransposedMatvec(const float* S, const float* phi, int64_t F, int64_t dv, float* y) {
  ForColumnBlocks(dv, [&](auto r, int64_t i, int64_t tail) HWY_ATTR {
    TransposedMatvecBlock<decltype(r)::value>(S, phi, F, dv, i, tail, y);
  });
}

// Columns [i, i + R lanes) of UpdateAndRead, and with them (tail > 0) the `tail` columns
// after them through Axpy's own scalar loop (the same rounding as TransposedMatvec's tail):
// one sweep over the rows for both.
template <int R>
HWY_INLINE void UpdateAndReadBlock(float* S, const float* phi_k, const float* vx,
                                   const float* phi_q, int64_t F, int64_t dv, int64_t i,
                                   int64_t tail, float* y) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  using V = decltype(hn::Zero(d));
  V acc[R > 0 ? R : 1], v[R > 0 ? R : 1];
  for (int r = 0; r < R; ++r) {
    acc[r] = hn::Zero(d);
    v[r] = hn::LoadU(d, vx + i + r * lanes);
  }
  const int64_t t0 = i + R * lanes;
  for (int64_t x = t0; x < t0 + tail; ++x) y[x] = 0.0f;
  for (int64_t f = 0; f < F; ++f) {
    float* row = S + f * dv + i;
    const auto ck = hn::Set(d, phi_k[f]), cq = hn::Set(d, phi_q[f]);
    for (int r = 0; r < R; ++r) {
      const auto s = hn::MulAdd(ck, v[r], hn::LoadU(d, row + r * lanes));
      hn::StoreU(s, d, row + r * lanes);
      acc[r] = hn::MulAdd(cq, s, acc[r]);
    }
    if (tail > 0) {
      Axpy(phi_k[f], vx + t0, S + f * dv + t0, tail);
      Axpy(phi_q[f], S + f * dv + t0, y + t0, tail);
    }
  }
  for (int r = 0; r < R; ++r) hn::StoreU(acc[r], d, y + i + r * lanes);
}

// The same Axpy per row as Rank1Update then TransposedMatvec (the same bits), with the row
// S_f kept in registers between its update and its read: S is read and written once (up to
// 4 vectors of y in registers per sweep, the scalar tail in the last sweep).
void UpdateAndRead(float* S, const float* phi_k, const float* vx, const float* phi_q, int64_t F,
                   int64_t dv, float* y) {
  ForColumnBlocks(dv, [&](auto r, int64_t i, int64_t tail) HWY_ATTR {
    UpdateAndReadBlock<decltype(r)::value>(S, phi_k, vx, phi_q, F, dv, i, tail, y);
  });
}

void SinCosScaled(const float* a, float mult, float* out_sin, float* out_cos, int64_t n) {
  // Highway's Sin/Cos hold 3 ulp on [-39000, 39000]; outside it use libm.
  constexpr float kRange = 39000.0f;
  if (MaxValue(a, n) > kRange || MinValue(a, n) < -kRange) {
    for (int64_t i = 0; i < n; ++i) {
      out_sin[i] = mult * std::sin(a[i]);
      out_cos[i] = mult * std::cos(a[i]);
    }
    return;
  }
  unary_rows(a, out_sin, n, [mult](const DF d, auto v) HWY_ATTR {
    return hn::Mul(hn::Sin(d, v), hn::Set(d, mult));
  });
  unary_rows(a, out_cos, n, [mult](const DF d, auto v) HWY_ATTR {
    return hn::Mul(hn::Cos(d, v), hn::Set(d, mult));
  });
}

}  // namespace favor::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace favor::cpu {
HWY_EXPORT(ExpAffine);
HWY_EXPORT(LogOrNegInf);
HWY_EXPORT(ExpShiftLive);
HWY_EXPORT(ExpAffinePlus);
HWY_EXPORT(MaxOfSignedSum);
HWY_EXPORT(MaxOfSignedSumLog);
HWY_EXPORT(ExpShiftLiveSums);
HWY_EXPORT(MaxValue);
HWY_EXPORT(MinValue);
HWY_EXPORT(SinCosScaled);
HWY_EXPORT(ScaleCopyNorm2);
HWY_EXPORT(ScaleCopy);
HWY_EXPORT(ScaleAdd);
HWY_EXPORT(ScaleCopyFinite);
HWY_EXPORT(KeyRowScales);
HWY_EXPORT(MulScaled);
HWY_EXPORT(AddFlooredProduct);
HWY_EXPORT(UpstreamRow);
HWY_EXPORT(Dot);
HWY_EXPORT(RowDots);
HWY_EXPORT(SumValues);
HWY_EXPORT(Rank1Update);
HWY_EXPORT(TransposedMatvec);
HWY_EXPORT(UpdateAndRead);

void exp_affine(const float* in, float sign, float offset, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ExpAffine)(in, sign, offset, out, n);
}
void log_or_neg_inf(const float* in, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(LogOrNegInf)(in, out, n);
}
void exp_shift_live(const float* a, float sign, float c, const float* log_s, float* out,
                    int64_t n) {
  HWY_DYNAMIC_DISPATCH(ExpShiftLive)(a, sign, c, log_s, out, n);
}
void exp_affine_plus(const float* a, float sign, float offset, const float* b, float* out,
                     int64_t n) {
  HWY_DYNAMIC_DISPATCH(ExpAffinePlus)(a, sign, offset, b, out, n);
}
float max_of_signed_sum(const float* a, float sign, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(MaxOfSignedSum)(a, sign, b, n);
}
float max_of_signed_sum_log(const float* a, float sign, const float* p, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(MaxOfSignedSumLog)(a, sign, p, n);
}
void exp_shift_live_sums(const float* a, float sign, float c, const float* p, float* out,
                         int64_t n) {
  HWY_DYNAMIC_DISPATCH(ExpShiftLiveSums)(a, sign, c, p, out, n);
}
float max_value(const float* a, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(MaxValue)(a, n);
}
float min_value(const float* a, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(MinValue)(a, n);
}
void sincos_scaled(const float* a, float mult, float* out_sin, float* out_cos, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SinCosScaled)(a, mult, out_sin, out_cos, n);
}
double scale_copy_norm2(const float* src, float mult, float* dst, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(ScaleCopyNorm2)(src, mult, dst, n);
}
void scale_copy(const float* src, float mult, float* dst, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleCopy)(src, mult, dst, n);
}
void scale_add(const float* prev, float f, const float* add, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ScaleAdd)(prev, f, add, out, n);
}
bool scale_copy_finite(const float* src, float mult, float* dst, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(ScaleCopyFinite)(src, mult, dst, n);
}
void key_row_scales(const float* prefix, float e, const float* inv_sigma, float* dphi, float* phi,
                    float* kscaled, int64_t n) {
  HWY_DYNAMIC_DISPATCH(KeyRowScales)(prefix, e, inv_sigma, dphi, phi, kscaled, n);
}
void add_floored_product(const float* p, const float* b, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(AddFlooredProduct)(p, b, out, n);
}
void mul_scaled(const float* a, const float* b, float e, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(MulScaled)(a, b, e, out, n);
}
bool upstream_row(const float* num, float den, const float* dy, float* g, int64_t dv) {
  return HWY_DYNAMIC_DISPATCH(UpstreamRow)(num, den, dy, g, dv);
}
float sum_values(const float* a, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(SumValues)(a, n);
}
float dot(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n);
}
void row_dots(const float* A, int64_t rows, int64_t n, const float* x, float mult, float* out) {
  HWY_DYNAMIC_DISPATCH(RowDots)(A, rows, n, x, mult, out);
}
void rank1_update(float* S, const float* phi, const float* v, int64_t F, int64_t dv) {
  HWY_DYNAMIC_DISPATCH(Rank1Update)(S, phi, v, F, dv);
}
void transposed_matvec(const float* S, const float* phi, int64_t F, int64_t dv, float* y) {
  HWY_DYNAMIC_DISPATCH(TransposedMatvec)(S, phi, F, dv, y);
}
void update_and_read(float* S, const float* phi_k, const float* vx, const float* phi_q, int64_t F,
                     int64_t dv, float* y) {
  HWY_DYNAMIC_DISPATCH(UpdateAndRead)(S, phi_k, vx, phi_q, F, dv, y);
}
}  // namespace favor::cpu
#endif  // HWY_ONCE
