"""The feature-map prologue shared by the Triton kernels (the canonical map of favor's C++
kernels: src/kernels/feature_params.hpp, docs/numerics.md).

On a tile of rows x [BLOCK_N, BLOCK_D] and a tile of features f0 .. f0 + BLOCK_F:
  a_f(x) = W_(f mod m) . x + bias_(f mod m)     (one tl.dot in fp32, input_precision PRECISION)
  keys:    l_jf = sign_f a_f(k_j) + g_j + key_logw_f,  g_j = norm_coef |k_j|^2 + pos_j rate
           (TRIG: l_jf = g_j + key_logw_f with the amplitude [sin a, cos a])
  queries: sign_f a_f(q_i)  (shifted by the caller's c_i); TRIG: [sin a, cos a].
Everything is kept in log2 units (log2 e folded in once) so that every feature is one exp2.
g_j is formed in float64 and the per-key offset g_j - M is rounded to float32 once, so a large
|k|^2 costs no precision beyond the rounding of W . k (docs/numerics.md, "Keys").
The kind is a constexpr epilogue: 0 EXP (F = m), 1 EXP_PM (F = 2m, +a then -a), 2 TRIG
(F = 2m, sin then cos). Features are never written to memory.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x log2 e)
LN2 = tl.constexpr(0.6931471805599453)
FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # a key normaliser below this is a dead feature


@triton.jit
def feature_tile(w_ptr, b_ptr, lw_ptr, f0, m, F, D,
                 KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                 BLOCK_F: tl.constexpr, BLOCK_D: tl.constexpr):
    """The parameters of features f0 .. f0 + BLOCK_F of one head: W rows [BLOCK_F, BLOCK_D]
    (row f mod m, zero past F or D), bias [BLOCK_F], key log weight in log2 units [BLOCK_F]
    (-inf past F, so those features never win a max and exp2 gives 0), sign [BLOCK_F]
    (+1 / -1 for EXP_PM's halves; 1 otherwise) and the in-range mask."""
    f = f0 + tl.arange(0, BLOCK_F)
    fok = f < F
    row = f % m
    d = tl.arange(0, BLOCK_D)
    w = tl.load(w_ptr + row[:, None] * D + d[None, :], mask=fok[:, None] & (d[None, :] < D),
                other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + row, mask=fok, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros([BLOCK_F], dtype=tl.float32)
    if HAS_LOGW:
        lw = tl.load(lw_ptr + row, mask=fok, other=0.0).to(tl.float32) * LOG2E
    else:
        lw = tl.zeros([BLOCK_F], dtype=tl.float32)
    lw = tl.where(fok, lw, float("-inf"))
    if KIND == 1:
        sign = tl.where(f < m, 1.0, -1.0)
    else:
        sign = tl.full([BLOCK_F], 1.0, tl.float32)
    return w, bias, lw, sign, fok


@triton.jit
def project(x, w, bias, PRECISION: tl.constexpr):
    """a = x W^T + bias: [BLOCK_N, BLOCK_F] in fp32 (x, w fp32 tiles, BLOCK_N, BLOCK_D >= 16)."""
    return tl.dot(x, tl.trans(w), input_precision=PRECISION) + bias[None, :]


@triton.jit
def key_offset(x, pos, norm_coef, rate, HAS_RATE: tl.constexpr):
    """g_j in log2 units as float64 [BLOCK_N]: norm_coef |x_j|^2 + pos_j rate, from the fp32
    row tile x (summed in float64)."""
    x64 = x.to(tl.float64)
    g = tl.sum(x64 * x64, 1) * norm_coef  # fp64 times an fp32 scalar stays fp64
    if HAS_RATE:
        g += pos.to(tl.float64) * rate
    return g * LOG2E


@triton.jit
def key_log2(a, sign, lw, KIND: tl.constexpr):
    """The key's log2-features without g_j: sign a log2 e + key_logw (TRIG: key_logw only),
    [BLOCK_N, BLOCK_F]; -inf on features past F."""
    if KIND == 2:
        return tl.zeros_like(a) + lw[None, :]
    else:
        return a * (sign * LOG2E)[None, :] + lw[None, :]


@triton.jit
def key_features(lk, off, ok, a, f, m, KIND: tl.constexpr):
    """phi [BLOCK_N, BLOCK_F] = exp2(lk + off) (times [sin a, cos a] for TRIG), zero where
    the key row is not ok (masked, past N) or the feature past F. off [BLOCK_N] fp32 is the
    per-key offset g_j - M (log2 units; finite where ok)."""
    phi = tl.where(ok[:, None], tl.exp2(lk + off[:, None]), 0.0)
    if KIND == 2:
        phi = phi * amplitude(a, f, m)
    return phi


@triton.jit
def amplitude(a, f, m):
    """TRIG's amplitude [sin a_f, cos a_f] on the feature tile: sin for f < m, cos after."""
    return tl.where((f < m)[None, :], tl.sin(a), tl.cos(a))
