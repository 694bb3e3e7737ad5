"""The feature-map prologue of every Triton kernel: the forward (attend.py), the backward
(gradients.py, through gradient_tiles.py) and the decode step (decode.py) all form phi and psi
with these helpers (the canonical map of favor's C++ kernels: ../canonical.py,
src/kernels/feature_params.hpp, docs/numerics.md).

On a tile of rows x [BLOCK_N, BLOCK_D] and a vector of feature indices f [BLOCK_F] (the
forward's f0 .. f0 + BLOCK_F over all F; the backward's base features f < m, whose pair
m + f is formed with -a):
  a_f(x) = W_(f mod m) . x + bias_(f mod m)     (one tl.dot in fp32, input_precision PRECISION)
  keys:    l_jf = sign_f a_f(k_j) + g_j + key_logw_f,  g_j = norm_coef |k_j|^2 + pos_j rate
           (TRIG: l_jf = g_j + key_logw_f with the amplitude [sin a, cos a])
  queries: sign_f a_f(q_i)  (shifted by the row's c_i); TRIG: [sin a, cos a].
Units: log2 everywhere (log2 e folded in once, where a log-feature is formed), so every
feature is one exp2 of a sum; the maxima M, the shifts c and the stored statistics are in
log2 units (natural = log2 value * ln 2).
Key offset: g_j is formed in float64 and the per-key offset g_j - M is rounded to float32 once
(key_shift), so a large |k|^2 (g_j ~ -|k|^2 / 2, cancelled by M) costs no precision beyond the
rounding of W . k (docs/numerics.md, "Keys"; the C++ kernels do the same). Everything else
is fp32.
The kind is a constexpr epilogue: 0 EXP (F = m), 1 EXP_PM (F = 2m, +a then -a), 2 TRIG
(F = 2m, sin then cos). Features are never written to memory.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x log2 e)
LN2 = tl.constexpr(0.6931471805599453)
FLT_MIN = tl.constexpr(1.1754943508222875e-38)  # a key normaliser below this is a dead feature


@triton.jit
def feature_tile(w_ptr, b_ptr, lw_ptr, f, m, F, D,
                 KIND: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_LOGW: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """The parameters of features f [BLOCK_F] of one head: W rows [BLOCK_F, BLOCK_D]
    (row f mod m, zero past F or D), bias [BLOCK_F], key log weight in log2 units [BLOCK_F]
    (-inf past F, so those features never win a max and exp2 gives 0), sign [BLOCK_F]
    (+1 / -1 for EXP_PM's halves; 1 otherwise) and the in-range mask f < F."""
    fok = f < F
    row = f % m
    d = tl.arange(0, BLOCK_D)
    w = tl.load(w_ptr + row[:, None] * D + d[None, :], mask=fok[:, None] & (d[None, :] < D),
                other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + row, mask=fok, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros(f.shape, dtype=tl.float32)
    if HAS_LOGW:
        lw = tl.load(lw_ptr + row, mask=fok, other=0.0).to(tl.float32) * LOG2E
    else:
        lw = tl.zeros(f.shape, dtype=tl.float32)
    lw = tl.where(fok, lw, float("-inf"))
    if KIND == 1:
        sign = tl.where(f < m, 1.0, -1.0)
    else:
        sign = tl.full(f.shape, 1.0, tl.float32)
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
def key_max(lk, g, ok):
    """Each key's largest log2-feature max_f l_jf + g_j [BLOCK_N] (float64 sum, rounded to
    fp32 once), -inf where the row is not ok: what the running max M is taken over."""
    return tl.where(ok, (tl.max(lk, 1).to(tl.float64) + g).to(tl.float32), float("-inf"))


@triton.jit
def key_shift(g, mref, ok):
    """The per-key offset g_j - M [BLOCK_N] fp32 for the reference max mref (per key or one
    value; log2 units), formed in float64 and rounded once; 0 where the row is not ok (so a
    key tile that has no max yet reads no inf)."""
    return tl.where(ok, g - mref.to(tl.float64), 0.0).to(tl.float32)


@triton.jit
def key_exp(lk, off, ok):
    """exp2(l - M) = exp2(lk + off) [BLOCK_N, BLOCK_F], zero where the key row is not ok
    (masked, past N) or the feature past F (lk = -inf there)."""
    return tl.where(ok[:, None], tl.exp2(lk + off[:, None]), 0.0)


@triton.jit
def key_features(lk, off, ok, a, f, m, KIND: tl.constexpr):
    """phi [BLOCK_N, BLOCK_F] = key_exp (times [sin a, cos a] for TRIG). off [BLOCK_N] fp32
    is key_shift's per-key offset g_j - M (finite where ok)."""
    phi = key_exp(lk, off, ok)
    if KIND == 2:
        phi = phi * amplitude(a, f, m)
    return phi


@triton.jit
def amplitude(a, f, m):
    """TRIG's amplitude [sin a_f, cos a_f] on the feature tile: sin for f < m, cos after."""
    return tl.where((f < m)[None, :], tl.sin(a), tl.cos(a))


@triton.jit
def query_log2(a, sign):
    """The query's log2-features sign a log2 e [BLOCK_N, BLOCK_F] (EXP kinds; the row's own
    constant terms cancel in the ratio and are never formed)."""
    return a * (sign * LOG2E)[None, :]


@triton.jit
def shift_terms(lq, z):
    """lq + log2 z where the feature is live (its key normaliser z >= FLT_MIN), -inf where
    dead: the row's shift c is their max over the features (lq, z broadcast together)."""
    live = z >= FLT_MIN
    return tl.where(live, lq + tl.log2(tl.where(live, z, 1.0)), float("-inf"))


@triton.jit
def query_features(lq, c, z):
    """psi = exp2(lq - c) where the feature is live (z >= FLT_MIN) and the row has a shift
    (c > -inf), 0 where dead, so exp2 cannot overflow into inf * 0 (lq, c, z broadcast
    together: c per row as a block, not a scalar; z per feature or per row and feature)."""
    live = (z >= FLT_MIN) & (c > float("-inf"))
    return tl.where(live, tl.exp2(lq - c), 0.0)
