"""favor.ops.attention.triton (forward, decode_step) run through Triton's CPU interpreter,
against the float64 oracle favor.torch.plain.attention_materialised and the C++ op
favor.torch.attention.

Tolerance (docs/numerics.md, rule 1): the relative Frobenius error of the float32 kernels
against the float64 oracle is at most twice that of the naive float32 evaluation of the same
formula (the oracle run in float32) plus 1e-6. Chunk sizes, F tiles and the decoder differ
from the causal forward only in summation order: (N + F) 2^-24 ~ 1e-5 relative (rule 3/4).
Every output and scratch buffer is poisoned with NaN (torch.empty patched), so an unwritten
element fails. Seeds are fixed. Rerun: cd python/tests && OMP_NUM_THREADS=1
PYTHONPATH=<favor build> python -m pytest -q test_triton_forward.py
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton: kernels run on CPU

import math
import subprocess
import sys

import pytest
import torch

import favor.torch
from favor.ops.attention.triton import decode_step, forward
from favor.torch.plain import attention_materialised

torch.set_num_threads(1)

KINDS = {"positive": 0, "hyperbolic": 1, "trig": 2, "hedgehog": 1}
_empty = torch.empty


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """torch.empty returns NaN-filled floating tensors while a test runs."""
    def empty(*args, **kwargs):
        t = _empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t
    monkeypatch.setattr(torch, "empty", empty)


def make_map(kernel, h, m, d, learned=True, decay=False, seed=0):
    """User-level parameters (w [H, m, D], bias, lam, gamma) and their canonical form."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(h, m, d, generator=g, dtype=torch.float64)
    bias = 0.3 * torch.randn(h, m, generator=g, dtype=torch.float64) if learned else None
    lam = (0.5 + torch.rand(h, m, generator=g, dtype=torch.float64)) if learned else None
    gamma = torch.tensor([0.9, 0.97], dtype=torch.float64)[:h] if decay else None
    if kernel == "hedgehog" and bias is None:
        bias = torch.zeros(h, m, dtype=torch.float64)  # the oracle's learned-map path
    scale = 1.0 / math.sqrt(d)
    canon = dict(W=(w * math.sqrt(scale)).float().contiguous(),
                 bias=None if bias is None else bias.float().contiguous(),
                 key_logw=None if lam is None else (2 * torch.log(lam.abs())).float().contiguous(),
                 rate=None if gamma is None else (-torch.log(gamma)).float().contiguous(),
                 norm_coef={"positive": -scale / 2, "hyperbolic": -scale / 2,
                            "trig": scale / 2, "hedgehog": 0.0}[kernel],
                 kind=KINDS[kernel])
    user = dict(w=w, kernel=kernel, scale=scale, bias=bias, lam=lam, decay=gamma)
    return user, canon


def inputs(b, h, nq, nk, d, dv, seed=1, norm=1.0):
    g = torch.Generator().manual_seed(seed)
    q = norm * torch.randn(b, h, nq, d, generator=g) / math.sqrt(d)
    k = norm * torch.randn(b, h, nk, d, generator=g) / math.sqrt(d)
    v = torch.randn(b, h, nk, dv, generator=g)
    return q, k, v


def run(q, k, v, canon, causal, keep, **kw):
    b, h, nq, d = q.shape
    y = forward(q.reshape(b * h, nq, d), k.reshape(b * h, -1, d),
                v.reshape(b * h, k.shape[2], -1), canon["W"], canon["bias"], canon["key_logw"],
                canon["rate"], canon["norm_coef"], canon["kind"], causal, keep, h,
                **{"precision": "ieee", **kw})
    if kw.get("return_stats"):
        y, stats = y
        return y.reshape(b, h, nq, -1), stats
    return y.reshape(b, h, nq, -1)


def oracle(q, k, v, user, causal, keep, dtype=torch.float64):
    cast = lambda t: None if t is None else t.to(dtype)  # noqa: E731
    return attention_materialised(cast(q), cast(k), cast(v), cast(user["w"]), user["kernel"],
                                  causal, user["scale"], keep, bias=cast(user["bias"]),
                                  lam=cast(user["lam"]), decay=user["decay"])


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300))


def check_vs_oracle(y, q, k, v, user, causal, keep):
    """Rule 1 of docs/numerics.md: error <= 2 x naive float32 + 1e-6."""
    assert torch.isfinite(y).all()
    ref = oracle(q, k, v, user, causal, keep)
    naive = rel(oracle(q, k, v, user, causal, keep, torch.float32), ref)
    err = rel(y, ref)
    assert err <= 2 * naive + 1e-6, (err, naive)


@pytest.mark.parametrize("kernel", ["positive", "hyperbolic", "trig", "hedgehog"])
@pytest.mark.parametrize("causal", [False, True])
def test_kinds_vs_oracle(kernel, causal):
    """Learned weights [H, m, D] + bias + lambda, a key padding mask (a fully masked batch row
    prefix), decay when causal; N = 65 in chunks of 16 (5 chunks, a ragged tail of 1); F = 16
    (positive) or 32 in tiles of 16 (several F tiles); Dv = 20 in tiles of 16 (a ragged Dv tile)."""
    b, h, n, d, m, dv = 2, 2, 65, 16, 16, 20
    user, canon = make_map(kernel, h, m, d, decay=causal)
    q, k, v = inputs(b, h, n, n, d, dv)
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[1, :5] = False
    keep[0, 30:33] = False
    y = run(q, k, v, canon, causal, keep, chunk=16, block_f=16, block_dv=16)
    check_vs_oracle(y, q, k, v, user, causal, keep)
    if causal:  # rows before the first kept key see nothing: zeros
        assert (y[1, :, :5] == 0).all()


@pytest.mark.parametrize("nq,nk,d", [(1, 1, 16), (7, 130, 32), (64, 63, 32), (130, 7, 16)])
def test_bidirectional_sizes(nq, nk, d):
    """Ragged tails, Nq != Nk, N = 1, F = 64 (one default tile) with D = 32."""
    user, canon = make_map("positive", 1, 64 if d == 32 else 16, d, seed=nq)
    q, k, v = inputs(1, 1, nq, nk, d, 16, seed=nk)
    check_vs_oracle(run(q, k, v, canon, False, None), q, k, v, user, False, None)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_causal_sizes(n):
    """N = 1, a single partial chunk, exactly one chunk (default chunk 64), D = 32, F = 64."""
    user, canon = make_map("hyperbolic", 2, 32, 32, seed=n)
    q, k, v = inputs(1, 2, n, n, 32, 16, seed=n)
    check_vs_oracle(run(q, k, v, canon, True, None), q, k, v, user, True, None)


@pytest.mark.parametrize("kernel,causal", [("positive", False), ("trig", True),
                                           ("hyperbolic", True)])
def test_tiny_map_and_masked_rows(kernel, causal):
    """m = 1 (F = 1 or 2 in a tile of 16), D = 20 (not a power of two), Dv = 1, and a batch
    row whose keys are all masked: its outputs are zeros, never NaN."""
    b, h, n, d = 2, 1, 9, 20
    user, canon = make_map(kernel, h, 1, d, decay=causal)
    q, k, v = inputs(b, h, n, n, d, 1)
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[1] = False
    y = run(q, k, v, canon, causal, keep, chunk=16)
    assert (y[1] == 0).all()
    check_vs_oracle(y[:1], q[:1], k[:1], v[:1], user, causal, keep[:1])


@pytest.mark.parametrize("causal", [False, True])
def test_per_batch_head_sets(causal):
    """W, bias and lambda with B*H sets (head bh uses set bh)."""
    b, h, n, d, m = 2, 2, 17, 16, 16
    user, canon = make_map("hyperbolic", b * h, m, d, seed=3)
    q, k, v = inputs(b, h, n, n, d, 16, seed=4)
    check_vs_oracle(run(q, k, v, canon, causal, None, chunk=16), q, k, v, user, causal, None)


@pytest.mark.parametrize("causal", [False, True])
def test_cpp_op(causal):
    """Against the C++ op favor.torch.attention (float32; same map and mask)."""
    b, h, n, d, m, dv = 1, 2, 33, 16, 16, 16
    user, canon = make_map("positive", h, m, d, decay=causal)
    q, k, v = inputs(b, h, n, n, d, dv)
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, 3] = False
    # 'tf32x3' is accepted; the interpreter computes every dot in exact fp32
    y = run(q, k, v, canon, causal, keep, chunk=16, precision="tf32x3")
    ref = favor.torch.attention(q, k, v, causal=causal, kernel="positive", features=m,
                                scale=user["scale"], key_padding_mask=~keep,
                                weights=user["w"].float(), bias=user["bias"].float(),
                                feature_weights=user["lam"].float(),
                                decay=None if user["decay"] is None else user["decay"].float())
    # two float32 evaluations of one formula: (N + F) 2^-24 each (rule 3)
    assert rel(y, ref) <= 2e-5


def test_chunk_invariance_and_stats():
    """Chunks 16 / 32 / 64 (and F tiles 16 / 64), and 1 / 3 / 5 key splits (bidirectional),
    give the same rows up to summation order;
    the statistics: denominators >= 1 (EXP kinds), the total state at the boundary equals the
    bidirectional state rescaled."""
    b, h, n, d, m = 1, 2, 65, 16, 32
    user, canon = make_map("hyperbolic", h, m, d)
    q, k, v = inputs(b, h, n, n, d, 16)
    y16, st = run(q, k, v, canon, True, None, chunk=16, block_f=16, return_stats=True)
    for chunk in (32, 64):
        assert rel(run(q, k, v, canon, True, None, chunk=chunk), y16) <= 1e-5
    assert (st["denominator"] >= 1 - 1e-6).all()
    assert st["scale"].shape == (b * h, n) and st["shift"].shape == (b * h, n)
    yb, sb = run(q, k, v, canon, False, None, return_stats=True)
    for splits in (1, 3, 5):  # key tiles per program: 5, 2, 1 of the 5 tiles of 16
        assert rel(run(q, k, v, canon, False, None, key_splits=splits), yb) <= 1e-5
    tot = st["S"][:, -1] * torch.exp2(st["boundary"][:, -1] - sb["scale"])[:, None, None]
    assert rel(tot, sb["S"]) <= 1e-5


def test_decode_matches_causal():
    """Row i of causal attention = decode_step after i + 1 appends (a key mask, then decay
    without a mask); a row's decay clock counts its tokens from its first kept one on."""
    b, h, n, d, m, dv = 2, 2, 6, 16, 16, 20
    for kernel, decay, mask in (("positive", False, True), ("trig", True, False),
                                ("hedgehog", True, False)):
        user, canon = make_map(kernel, h, m, d, decay=decay)
        q, k, v = inputs(b, h, n, n, d, dv)
        keep = torch.ones(b, n, dtype=torch.bool)
        if mask:
            keep[1, 0] = keep[0, 2] = False
        y = run(q, k, v, canon, True, keep if mask else None, chunk=16)
        F = m if canon["kind"] == 0 else 2 * m
        state = (torch.zeros(b * h, F, dv + 1),
                 torch.full((b * h,), -math.inf, dtype=torch.float64),
                 torch.zeros(b, dtype=torch.int64), 0)
        for i in range(n):
            step = lambda t: t[:, :, i:i + 1].reshape(b * h, 1, -1).contiguous()  # noqa: E731
            yi, *state = decode_step(*state, step(q), step(k), step(v), canon["W"], canon["bias"],
                                     canon["key_logw"], canon["rate"], canon["norm_coef"],
                                     canon["kind"], keep[:, i] if mask else None, h,
                                     block_f=16, block_dv=16)
            assert rel(yi.reshape(b, h, -1), y[:, :, i]) <= 1e-5, (kernel, i)
        first = keep.long().argmax(1)  # each row's first kept token
        assert state[3] == n and torch.equal(state[2], n - first)


def test_decode_state_matches_cpp_decoder():
    """The state layout is the C++ decoder's (favor.ops.decode_step): after each step the
    outputs, sums, log_max, row clocks and position agree (a learned map, a key mask and
    decay: the clock counts kept tokens in both)."""
    import favor.ops
    b, h, n, d, m, dv = 2, 2, 5, 16, 16, 16
    user, canon = make_map("hyperbolic", h, m, d, decay=True)
    q, k, v = inputs(b, h, n, n, d, dv)
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, 1] = keep[1, 3] = False
    F = 2 * m
    ref = favor.ops.empty_state(b, h, dv, F)
    state = (torch.zeros(b * h, F, dv + 1), torch.full((b * h,), -math.inf, dtype=torch.float64),
             torch.zeros(b, dtype=torch.int64), 0)
    for i in range(n):
        step = lambda t: t[:, :, i:i + 1].contiguous()  # noqa: E731
        y_ref, ref = favor.ops.decode_step(
            ref, step(q), step(k), step(v), user["w"][0].float(), kernel="hyperbolic",
            scale=user["scale"], key_mask=keep[:, i:i + 1], weights=user["w"].float(),
            bias=user["bias"].float(), feature_weights=user["lam"].float(),
            decay=user["decay"].float())
        flat = lambda t: step(t).reshape(b * h, 1, -1)  # noqa: E731
        y, *state = decode_step(*state, flat(q), flat(k), flat(v), canon["W"], canon["bias"],
                                canon["key_logw"], canon["rate"], canon["norm_coef"],
                                canon["kind"], keep[:, i], h)
        assert rel(y.reshape(b, h, 1, -1), y_ref) <= 1e-5
        assert rel(state[0], ref[0].reshape(b * h, F, dv + 1)) <= 1e-5
        assert torch.allclose(state[1], ref[1].reshape(-1), rtol=1e-6, atol=1e-6)
        assert torch.equal(state[2], ref[2]) and state[3] == int(ref[3])


def test_decode_functional():
    """decode_step leaves its inputs as they were."""
    user, canon = make_map("positive", 1, 16, 16)
    q, k, v = inputs(1, 1, 1, 1, 16, 16)
    sums, lm = torch.rand(1, 16, 17), torch.tensor([0.5], dtype=torch.float64)
    rows = torch.zeros(1, dtype=torch.int64)
    copies = (sums.clone(), lm.clone(), rows.clone())
    out = decode_step(sums, lm, rows, 3, q[0], k[0], v[0], canon["W"], canon["bias"],
                      canon["key_logw"], None, canon["norm_coef"], 0, None, 1)
    assert all(torch.equal(a, b) for a, b in zip((sums, lm, rows), copies))
    assert out[4] == 4 and torch.isfinite(out[1]).all() and out[2].item() >= 0.5


@pytest.mark.parametrize("causal", [False, True])
def test_huge_norms_finite(causal):
    """|q| = |k| = 1e3 (exponents ~1e5): outputs finite, inside the values' hull."""
    user, canon = make_map("positive", 1, 16, 16, learned=False)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 1, 20, 16, generator=g)
    k = torch.randn(1, 1, 20, 16, generator=g)
    q, k = 1e3 * q / q.norm(dim=-1, keepdim=True), 1e3 * k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(1, 1, 20, 16, generator=g)
    y = run(q, k, v, canon, causal, None, chunk=16)
    assert torch.isfinite(y).all()
    assert (y.abs() <= v.abs().max() * (1 + 1e-5)).all()


def test_fp16_inputs():
    """fp16 q, k, v: the kernels load and compute in fp32, so the result is the fp32 call on
    the rounded inputs, rounded to fp16 (half an fp16 ulp: 2^-11 relative)."""
    user, canon = make_map("trig", 2, 16, 16)
    q, k, v = inputs(1, 2, 33, 33, 16, 16)
    q, k, v = q.half(), k.half(), v.half()
    for causal in (False, True):
        y16 = run(q, k, v, canon, causal, None, chunk=16)
        y32 = run(q.float(), k.float(), v.float(), canon, causal, None, chunk=16)
        assert y16.dtype == torch.float16
        assert ((y16.float() - y32).abs() <= 2 ** -11 * y32.abs() + 1e-7).all()


def test_errors_name_the_argument():
    user, canon = make_map("positive", 1, 16, 16)
    q, k, v = (t[0] for t in inputs(1, 1, 4, 4, 16, 16))
    args = [canon["W"], None, None, None, canon["norm_coef"], 0, False, None, 1]
    with pytest.raises(ValueError, match="^k:"):
        forward(q, k[:, :, :8].contiguous(), v, *args)
    with pytest.raises(ValueError, match="^v:"):
        forward(q, k, v.transpose(1, 2), *args)
    with pytest.raises(ValueError, match="^chunk:"):
        forward(q, k, v, *args[:6], True, None, 1, chunk=24)
    with pytest.raises(ValueError, match="^rate:"):
        forward(q, k, v, canon["W"], None, None, torch.ones(1), 0.0, 0, False, None, 1)
    with pytest.raises(ValueError, match="^kind:"):
        forward(q, k, v, canon["W"], None, None, None, 0.0, 3, False, None, 1)


COMPILE = r"""
import importlib, sys, time, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
fw = importlib.import_module("favor.ops.attention.triton.attend")  # the modules (the package
decode = importlib.import_module("favor.ops.attention.triton.decode")  # exports functions)
t0 = time.time()
target = GPUTarget("cuda", 90, 64)
D, F, C, DV, BF, BDV = 64, 256, 64, 64, 64, 64
def comp(fn, sig, const, warps):
    fn = getattr(fn, "fn", fn)  # the jitted function under the device's autotuner
    full = {k: sig.get(k, "constexpr") for k in fn.arg_names}
    k = triton.compile(ASTSource(fn=fn, signature=full, constexprs=const), target=target,
                       options={"num_warps": warps})
    assert k.asm["cubin"], fn.__name__
P, io = "*fp32", "*" + sys.argv[1]
W8 = fw.NUM_WARPS
flags = dict(KIND=1, HAS_BIAS=True, HAS_LOGW=True, HAS_RATE=True, HAS_KEEP=True)
ints = {n: "i32" for n in ("N", "D", "DV", "F", "m", "H", "W_SETS", "B_SETS", "L_SETS",
                           "R_SETS", "T", "NC", "N_F", "TPP", "N_DV")}
comp(fw._key_partials, {**ints, "k_ptr": io, "v_ptr": io, "w_ptr": P, "b_ptr": P, "lw_ptr": P,
     "r_ptr": P, "keep_ptr": "*i8", "ps_ptr": P, "pz_ptr": P, "pm_ptr": P, "rm_ptr": P,
     "norm_coef": "fp32"}, {**flags, "STORE_ROWMAX": True, "PRECISION": "tf32",
     "BLOCK_N": C, "BLOCK_F": BF, "BLOCK_D": D, "BLOCK_DV": BDV}, W8)
comp(fw._causal_out, {**ints, "q_ptr": io, "k_ptr": io, "v_ptr": io, "w_ptr": P, "b_ptr": P,
     "lw_ptr": P, "r_ptr": P, "keep_ptr": "*i8", "rm_ptr": P, "hs_ptr": P, "hz_ptr": P,
     "hb_ptr": P, "y_ptr": io, "den_ptr": P, "c_ptr": P, "mrow_ptr": P, "norm_coef": "fp32"},
     {**flags, "PRECISION": "tf32", "C": C, "BLOCK_F": fw.CAUSAL_BLOCK_F, "BLOCK_D": D,
      "BLOCK_DV": BDV}, W8)
comp(fw._bidir_queries, {**ints, "q_ptr": io, "w_ptr": P, "b_ptr": P, "s_ptr": P, "z_ptr": P,
     "y_ptr": io, "den_ptr": P, "c_ptr": P}, {"KIND": 0, "HAS_BIAS": True,
     "PRECISION": "tf32", "BLOCK_N": 64, "BLOCK_F": BF, "BLOCK_D": D, "BLOCK_DV": BDV}, W8)
comp(decode._decode, {**ints, "q_ptr": io, "k_ptr": io, "v_ptr": io, "w_ptr": P, "b_ptr": P,
     "lw_ptr": P, "r_ptr": P, "keep_ptr": "*i8", "sums_ptr": P, "lm_ptr": "*fp64",
     "pos_ptr": "*i64", "y_ptr": io, "out_ptr": P, "nlm_ptr": "*fp64", "norm_coef": "fp32"},
     {**flags, "BLOCK_F": BF, "BLOCK_D": D, "BLOCK_DV": BDV}, decode.NUM_WARPS)
band = importlib.import_module("favor.ops.hybrid.triton.band")
for causal in (True, False):  # hybrid attention's exact part (fp32 inputs: band() casts;
    # not autotuned, so wrapped as comp() unwraps an autotuner's .fn)
    comp(type("Tuned", (), {"fn": band._band_fwd}), {"Q": P, "K": P, "V": P, "KEEP": "*i8", "SINK": "*i32", "OUT": P,
         "MAX": P, "n": "i32", "d": "i32", "dv": "i32", "scale": "fp32", "window": "i32",
         "sinks": "i32"}, {"CAUSAL": causal, "BM": band.BM, "BN": band.BN, "BD": D,
         "BDV": 128, "BS": 16}, 4)
hybrid = importlib.import_module("favor.ops.hybrid.triton.decode")
for kind, ring, estimate, sinks in ((1, True, True, True), (2, False, True, False),
                                    (0, True, False, True)):
    # the hybrid decode step (fp32 inputs: the op casts), every map option and part (not
    # autotuned: wrapped as the band is)
    comp(type("Tuned", (), {"fn": hybrid._hybrid_decode}), {**ints, "q_ptr": P, "k_ptr": P, "v_ptr": P, "w_ptr": P,
         "b_ptr": P, "lw_ptr": P, "r_ptr": P, "lc_ptr": "*fp64", "keep_ptr": "*i8",
         "sums_ptr": P, "lm_ptr": "*fp64", "rows_ptr": "*i64", "pos_ptr": "*i64", "rk_ptr": P,
         "rv_ptr": P, "rkeep_ptr": "*u8", "rsink_ptr": "*u8", "sk_ptr": P, "sv_ptr": P,
         "spos_ptr": "*i64", "cnt_ptr": "*i32", "y_ptr": P, "B": "i32", "W": "i32",
         "S": "i32", "C_SETS": "i32", "norm_coef": "fp32", "scale": "fp32"},
         {**flags, "KIND": kind, "ESTIMATE": estimate, "HAS_RING": ring, "HAS_SINKS": sinks,
          "BLOCK_F": BF, "BLOCK_D": D, "BLOCK_DV": BDV, "BLOCK_W": 64, "BLOCK_S": 4},
         hybrid.NUM_WARPS)
if sys.argv[1] == "fp32":  # no input dtype in these two
    comp(fw._combine, {"ps_ptr": P, "pz_ptr": P, "pm_ptr": P, "s_ptr": P, "z_ptr": P,
         "m_ptr": P, "T": "i32", "F": "i32", "DV": "i32", "N_F": "i32"},
         {"BLOCK_F": BF, "BLOCK_DV": BDV, "BLOCK_NF": 4}, W8)
    comp(fw._scan, {"ps_ptr": P, "pz_ptr": P, "pm_ptr": P, "hs_ptr": P, "hz_ptr": P,
         "hb_ptr": P, "NC": "i32", "F": "i32", "DV": "i32", "N_F": "i32"},
         {"BLOCK_F": BF, "BLOCK_DV": BDV, "BLOCK_NF": 4}, W8)
print("%s: compiled in %.1f s" % (sys.argv[1], time.time() - t0))
"""


# CI compiles for bf16, the dtype the interpreter cannot run; FAVOR_TRITON_COMPILE=1 all three.
COMPILE_DTYPES = ["fp16", "bf16", "fp32"] if os.environ.get("FAVOR_TRITON_COMPILE") else ["bf16"]


@pytest.mark.parametrize("dtype", COMPILE_DTYPES)
def test_compiles_for_sm90(dtype):
    """Each kernel lowers to a cubin for sm_90 (the ptxas bundled with triton; no GPU needed)
    at D = 64, F = 256 (tiles of 64; 16 in _causal_out), C = 64, Dv = 64, with every map
    option on, for bf16 inputs (fp16 and fp32 too with FAVOR_TRITON_COMPILE=1): the
    interpreter accepts kernels the GPU compiler rejects (tiles under 16, non-constexpr
    globals). A subprocess without TRITON_INTERPRET, since the interpreter replaces the
    kernels. About 5-9 s per dtype with a cold Triton cache on one core, well under 1 s warm."""
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.access(ptxas, os.X_OK):
        pytest.skip("no bundled ptxas: cannot lower for sm_90 without a CUDA toolchain")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", COMPILE, dtype], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout.strip())


# ---- hybrid attention's exact part: the window inside the tile (hybrid/triton/band.py) ---

@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,sinks", [(5, 2), (0, 3), (20, 0), (1, 1)])
def test_band_kernel_equals_the_torch_band(causal, window, sinks):
    """The fused band kernel gives chunk._band's rows and maxima: key masks (left padding
    moves the sinks), N not a multiple of the tiles, sinks inside and outside the window."""
    from favor.ops.hybrid import chunk as hybrid
    from favor.ops.hybrid.triton.band import band
    g = torch.Generator().manual_seed(7)
    bh, n, d, dv = 4, 37, 16, 8
    q, k = (torch.randn(bh, n, d, generator=g) for _ in range(2))
    v = torch.randn(bh, n, dv, generator=g)
    keep = torch.ones(bh, n, dtype=torch.bool)
    keep[1, :6] = False
    keep[2, 10:13] = False
    sink = hybrid.sink_mask(keep, n, sinks, bh, q.device)
    want, want_max = hybrid._band(q, k, v, keep, sink, sinks, causal, window, d ** -0.5)
    got, got_max = band(q, k, v, keep, sink, sinks, causal, window, d ** -0.5)
    assert torch.equal(torch.isinf(got_max), torch.isinf(want_max))
    live = ~torch.isinf(want_max)
    assert (got_max[live] - want_max[live]).abs().max() < 1e-5
    assert (got[live] - want[live]).abs().max() < 1e-4 * want[live].abs().max()
