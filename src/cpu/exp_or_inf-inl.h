// ExpOrInf, the exp of favor's Highway files (vec_math.cpp, vec_columns.cpp): a Highway
// -inl header, included once per SIMD target by the files foreach_target compiles.
#if defined(FAVOR_CPU_EXP_OR_INF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FAVOR_CPU_EXP_OR_INF_INL_H_
#undef FAVOR_CPU_EXP_OR_INF_INL_H_
#else
#define FAVOR_CPU_EXP_OR_INF_INL_H_
#endif

#include <hwy/contrib/math/math-inl.h>
#include <hwy/highway.h>

#include <cstdint>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace favor::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway's float Exp is valid up to +104 and returns finite garbage far above: every exp
// here returns +inf above log(FLT_MAX), so overflow is seen as overflow.
constexpr float kExpMax = 88.72283f;

template <class D, class V>
HWY_INLINE V ExpOrInf(const D d, V x) {
  // Highway's Exp step by step (hwy/contrib/math/math-inl.h): q = round(x / ln 2), the
  // reduction and polynomial, then the scale by 2^q in two exact steps (for results near
  // the ends of the float range) and a zero below -104. Where every lane has
  // -125 <= q <= 126 the result is normal and finite, the two steps equal one multiply by
  // 2^q, and neither the zero nor the overflow guard below applies: the same bits for ~20%
  // fewer instructions (exps were ~12% of a one-thread causal forward).
  hn::impl::ExpImpl<float> impl;
  const hn::Rebind<int32_t, D> di;
  const auto q =
      impl.ToInt32(d, hn::MulAdd(x, hn::Set(d, 1.442695040888963407359924681f),
                                 hn::Or(hn::Set(d, 0.5f), hn::And(x, hn::Set(d, -0.0f)))));
  if (hn::AllTrue(di, hn::And(hn::Gt(q, hn::Set(di, -126)), hn::Lt(q, hn::Set(di, 127))))) {
    const auto y = hn::Add(impl.ExpPoly(d, impl.ExpReduce(d, x, q)), hn::Set(d, 1.0f));
    return hn::Mul(y, impl.Pow2I(d, q));
  }
  return hn::IfThenElse(hn::Gt(x, hn::Set(d, kExpMax)),
                        hn::Set(d, std::numeric_limits<float>::infinity()),
                        hn::Exp(d, hn::Min(x, hn::Set(d, kExpMax))));
}

}  // namespace favor::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FAVOR_CPU_EXP_OR_INF_INL_H_
