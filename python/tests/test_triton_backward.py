"""The fused Triton backward (favor/ops/attention/triton/gradients.py) against float64 autograd
of the canonical map, and against favor's C++ backward through favor.torch.attention.

Runs on the CPU through Triton's interpreter (exact fp32 dots: precision "ieee"). Every buffer
the module allocates is filled with NaN first, so an element no kernel writes fails.
Rerun: cd python/tests && OMP_NUM_THREADS=1 python -m pytest -q test_triton_backward.py

Tolerance (relative Frobenius error against float64 autograd, inputs of norm <= ~2): each
gradient is a chain of fp32 steps, every one a sum over at most N + F + D <= 130 + 64 + 32
terms of bounded exps (|log-feature| <= ~4 at these norms), so each step carries at most
~226 u = 1.3e-5 (u = 2^-24) relative; the ratio's gradient g - (g.y) subtracts terms of the
size of the result, which can cost a few times that: 1e-4 bounds it with room for that factor,
and a wrong term (a missed chunk, a wrong scale) errs by O(1e-2) or more.
"""
import importlib
import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")
import favor  # noqa: E402,F401
import favor.torch  # noqa: E402
from favor.torch.plain import attention_materialised  # noqa: E402

# the module of the backward kernels
bwd = importlib.import_module("favor.ops.attention.triton.gradients")

torch.set_num_threads(1)
TOL = 1e-4
KINDS = {"positive": 0, "hyperbolic": 1, "hedgehog": 1, "trig": 2}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every buffer of the module starts as NaN."""
    def nan_empty(*size, dtype, device):
        return torch.full(size[0] if len(size) == 1 and not isinstance(size[0], int) else size,
                          float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(bwd, "_empty", nan_empty)


def per_head(t, bh):
    """The set of each head: [BH, ...] from [sets, ...] (head bh uses set bh % sets)."""
    return t[torch.arange(bh) % t.shape[0]]


def canonical(q, k, v, W, bias, klw, rate, norm_coef, kind, causal, keep, heads, norm_shift=0.0):
    """y of the canonical map, materialised and unstabilised, in the dtype of the inputs.
    norm_shift: a constant taken off every |k_j|^2 (it cancels in the ratio), so that keys
    of a large common norm neither underflow nor overflow here."""
    bh, nk = k.shape[0], k.shape[1]
    Wh = per_head(W, bh)
    aq, ak = q @ Wh.transpose(1, 2), k @ Wh.transpose(1, 2)
    if bias is not None:
        aq, ak = aq + per_head(bias, bh)[:, None], ak + per_head(bias, bh)[:, None]
    g = norm_coef * ((k * k).sum(-1, keepdim=True) - norm_shift)
    if rate is not None:
        g = g + torch.arange(nk, dtype=q.dtype)[None, :, None] * per_head(rate, bh)[:, None, None]
    lw = 0.0 if klw is None else per_head(klw, bh)[:, None]
    if kind == 0:
        psi, phi = torch.exp(aq), torch.exp(ak + g + lw)
    elif kind == 1:
        psi = torch.cat([torch.exp(aq), torch.exp(-aq)], -1)
        phi = torch.cat([torch.exp(ak + g + lw), torch.exp(-ak + g + lw)], -1)
    else:
        psi = torch.cat([torch.sin(aq), torch.cos(aq)], -1)
        e = torch.exp(g + lw)  # [BH, Nk, m], or [BH, Nk, 1] without key_logw
        phi = torch.cat([torch.sin(ak) * e, torch.cos(ak) * e], -1)
    a = psi @ phi.transpose(1, 2)
    if keep is not None:
        a = a * keep.to(a.dtype)[torch.arange(bh) // heads][:, None, :]
    if causal:
        a = torch.tril(a)
    num, den = a @ v, a.sum(-1, keepdim=True)
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def user_to_canonical(w, kernel, scale, bias=None, lam=None, decay=None):
    """favor's user-level map (w unscaled, lambda, gamma) as canonical parameters."""
    W = (w if w.dim() == 3 else w[None]) * math.sqrt(scale)
    norm_coef = {"positive": -scale / 2, "hyperbolic": -scale / 2, "trig": scale / 2,
                 "hedgehog": 0.0}[kernel]
    klw = None if lam is None else 2 * torch.log(lam.abs())
    rate = None if decay is None else -torch.log(decay)
    return W, bias, klw, rate, norm_coef


def make_case(kernel, b, h, nq, nk, d, dv, m, causal, masked, learned, seed, same_sets=False):
    """Inputs of one case (float64, norms ~1), user-level map tensors and the keep mask.
    Learned maps: weights with H sets, bias with B*H and lambda with 1 (or all with H:
    same_sets, as favor.torch.attention requires)."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k = rnd(b, h, nq, d) * 0.8, rnd(b, h, nk, d) * 0.8
    v = rnd(b, h, nk, dv)
    user = dict(w=rnd(h, m, d) if learned else rnd(m, d))
    if learned:
        user.update(bias=rnd(h if same_sets else b * h, m) * 0.3,
                    lam=1 + 0.2 * rnd(h if same_sets else 1, m))
        if causal:
            user["decay"] = torch.tensor([0.9, 0.97], dtype=torch.float64)[:h]
    keep = None
    if masked:
        keep = torch.rand(b, nk, generator=gen) > 0.3
        keep[0, : nk // 2] = False  # a masked prefix: early causal rows see no key
    return q, k, v, user, keep


def canonical_grads(q, k, v, dy, params, kind, causal, keep, heads, norm_shift=0.0):
    """float64 autograd of the canonical oracle: (y, dq, dk, dv, dW, dbias, dklw, drate)."""
    leaves = [t.detach().clone().requires_grad_(True) if t is not None else None
              for t in (q, k, v, *params[:4])]
    y = canonical(*leaves, params[4], kind, causal, keep, heads, norm_shift)
    y.backward(dy)
    return (y.detach(), *[None if t is None else t.grad for t in leaves])


def rel(a, b, floor=1e-30):
    """Relative Frobenius error of a against b; floor: the smallest norm to divide by (a
    gradient whose terms cancel exactly, such as dq with one key, is judged against the size
    of its terms instead of zero)."""
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), floor))


CASES = [  # kernel, B, H, Nq, Nk, D, Dv, m, causal, masked, learned, block_m
    ("positive", 1, 2, 7, 7, 16, 5, 16, False, True, False, None),
    ("positive", 2, 1, 65, 65, 16, 3, 16, True, True, False, None),
    ("hyperbolic", 1, 1, 130, 130, 32, 4, 32, True, False, False, 16),
    ("trig", 1, 2, 33, 65, 16, 5, 8, False, True, False, None),
    ("trig", 1, 1, 65, 65, 16, 2, 16, True, False, False, None),
    ("hedgehog", 2, 2, 65, 65, 16, 3, 32, True, True, True, 16),
    ("hedgehog", 1, 2, 30, 20, 32, 6, 8, False, False, True, None),
    ("positive", 1, 1, 1, 1, 16, 2, 16, True, False, False, None),
]


def _case_id(c):
    return f"{c[0]}-N{c[4]}-{'causal' if c[8] else 'bidi'}"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_gradients_match_float64_autograd(case):
    check_against_float64(case)


@pytest.mark.parametrize("case", [("positive", 1, 2, 40, 40, 16, 3, 16, True, False, False, None),
                                  ("hyperbolic", 1, 2, 40, 40, 16, 3, 16, False, False, False,
                                   None)], ids=_case_id)
def test_large_norms_need_the_shifts(case):
    """q, k six times larger: log-features up to ~150, far past float32's exp range without
    the shifts. The rounding of a log-feature l costs |l| u ~ 1e-5 relative on its feature,
    still inside TOL."""
    check_against_float64(case, amp=6.0)


@pytest.mark.parametrize("case", [("positive", 1, 2, 40, 40, 16, 3, 16, True, True, False, None),
                                  ("hyperbolic", 1, 2, 40, 40, 16, 3, 16, False, False, False,
                                   None),
                                  ("trig", 1, 2, 40, 40, 16, 3, 8, True, False, False, None)],
                         ids=_case_id)
def test_large_common_key_norm_keeps_the_key_offsets_exact(case):
    """Every key 1e3 out along a direction that no W row sees: g_j = norm_coef |k_j|^2 is
    about -+1.25e5 for every key, the same up to O(1), and cancels in the ratio, so the
    gradients are those of unit-size inputs. The kernels form g_j - M in float64 and round it
    once (features.key_shift, forward and backward alike); g_j in fp32 (ulp 0.0625 in
    |k_j|^2 ~ 1e6) would put ~0.4 % errors into the features."""
    check_against_float64(case, lift=1e3)


def check_against_float64(case, amp=1.0, lift=0.0):
    """The Triton gradients of one case (q, k scaled by amp) against float64 autograd; with
    lift, every key's last coordinate set to lift and W's last column to 0 (a common |k|^2
    that the oracle takes off: norm_shift)."""
    kernel, b, h, nq, nk, d, dv, m, causal, masked, learned, block_m = case
    q, k, v, user, keep = make_case(kernel, b, h, nq, nk, d, dv, m, causal, masked, learned, 1)
    q, k = q * amp, k * amp
    if lift:
        k[..., -1] = lift
        user["w"][..., -1] = 0.0
    scale = 1 / math.sqrt(d)
    params = user_to_canonical(user["w"], kernel, scale, user.get("bias"), user.get("lam"),
                               user.get("decay"))
    kind = KINDS[kernel]
    flat = lambda t: t.reshape(b * h, *t.shape[2:])  # noqa: E731
    dy = torch.randn(b * h, nq, dv, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    ref = canonical_grads(flat(q), flat(k), flat(v), dy, params, kind, causal, keep, h,
                          lift ** 2)
    # the oracle is the canonical map: first check it against favor's own float64 oracle
    # (which forms |k|^2 as it is: over- or underflows with lift)
    if not lift:
        y_user = attention_materialised(q, k, v, user["w"], kernel, causal, scale, keep,
                                        bias=user.get("bias"), lam=user.get("lam"),
                                        decay=user.get("decay"))
        assert rel(ref[0], flat(y_user)) < 1e-12
    f = lambda t: None if t is None else t.float()  # noqa: E731
    got = bwd.backward(f(dy), f(flat(q)), f(flat(k)), f(flat(v)), f(ref[0]),
                       *[f(t) for t in params[:4]], params[4], kind, causal, keep, h, chunk=16,
                       precision="ieee", block_m=block_m)
    names = ("dq", "dk", "dv", "dW", "dbias", "dkey_logw", "drate")
    for name, g, r in zip(names, got, ref[1:]):
        assert (g is None) == (r is None), name
        if g is None:
            continue
        assert g.shape == r.shape and torch.isfinite(g).all(), name
        # the terms of every gradient here are ~|dy| (unit-size inputs and parameters)
        assert rel(g, r, float(dy.norm())) <= TOL, (name, rel(g, r))
    if keep is not None:  # masked keys: exactly zero
        dead = ~keep[torch.arange(b * h) // h]
        assert (got[1][dead] == 0).all() and (got[2][dead] == 0).all()


def _cxx_case(kernel, causal, learned, seed):
    """One case through favor.torch.attention (C++ forward and backward, float32) and the
    Triton backward on the same inputs and the C++ forward's y."""
    b, h, n, d, dv, m = 2, 2, 37, 16, 3, 16
    q, k, v, user, keep = make_case(kernel, b, h, n, n, d, dv, m, causal, True, learned, seed,
                                    same_sets=True)
    scale = 1 / math.sqrt(d)
    leaves = {name: t.float().requires_grad_(True)
              for name, t in dict(q=q, k=k, v=v, **user).items()}
    kw = dict(kernel=kernel, causal=causal, scale=scale, key_padding_mask=~keep)
    if learned:
        kw.update(projection=torch.zeros(m, d), weights=leaves["w"], bias=leaves["bias"],
                  feature_weights=leaves["lam"], decay=leaves.get("decay"))
    else:
        kw.update(projection=leaves["w"])
    y = favor.torch.attention(leaves["q"], leaves["k"], leaves["v"], **kw)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3))
    y.backward(dy)
    det = {name: t.detach() for name, t in leaves.items()}
    params = user_to_canonical(det["w"], kernel, scale, det.get("bias"), det.get("lam"),
                               det.get("decay"))
    flat = lambda t: t.reshape(b * h, *t.shape[2:])  # noqa: E731
    got = bwd.backward(flat(dy), flat(det["q"]), flat(det["k"]), flat(det["v"]),
                       flat(y.detach()), *params[:4], params[4], KINDS[kernel], causal, keep, h,
                       chunk=16, precision="ieee")
    return leaves, det, got, flat, scale


@pytest.mark.parametrize("kernel,causal,learned", [("positive", False, False),
                                                    ("hedgehog", True, True)])
def test_gradients_match_cxx_backward(kernel, causal, learned):
    """Against favor's C++ backward: each side is within TOL of float64 (the C++ side by its
    own tests, this side by the test above), so they differ by at most 2 TOL. User-level
    parameter gradients by the chain rule: W = w sqrt(scale), key_logw = 2 log|lambda|,
    rate = -log gamma."""
    leaves, det, got, flat, scale = _cxx_case(kernel, causal, learned, 4)
    dq, dk, dv, dW, dbias, dklw, drate = got
    pairs = [(dq, flat(leaves["q"].grad)), (dk, flat(leaves["k"].grad)),
             (dv, flat(leaves["v"].grad)),
             (dW.reshape(leaves["w"].shape) * math.sqrt(scale), leaves["w"].grad)]
    if learned:
        pairs += [(dbias, leaves["bias"].grad), (dklw * 2 / det["lam"], leaves["lam"].grad),
                  (-drate / det["decay"], leaves["decay"].grad)]
    for i, (g, r) in enumerate(pairs):
        assert rel(g, r) <= 2 * TOL, (i, rel(g, r))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_equal_fp32_on_rounded_inputs(dtype):
    """fp16 / bf16 inputs are loaded and computed in fp32: the gradients equal those of the
    fp32 call on the rounded inputs exactly, up to the final rounding of dq, dk, dv (exact
    for fp16; bf16: one of the two neighbours, as Triton's interpreter truncates fp32 -> bf16
    where the GPU rounds to nearest)."""
    q, k, v, user, keep = make_case("hyperbolic", 1, 2, 40, 40, 16, 4, 8, True, True, False, 5)
    params = user_to_canonical(user["w"].float(), "hyperbolic", 0.25)
    x16 = [t.reshape(2, 40, -1).to(dtype) for t in (q, k, v)]
    y16 = torch.randn(2, 40, 4, generator=torch.Generator().manual_seed(6)).to(dtype)
    dy16 = torch.randn(2, 40, 4, generator=torch.Generator().manual_seed(7)).to(dtype)
    args = (*params[:4], params[4], 1, True, keep, 2)
    g16 = bwd.backward(dy16, *x16, y16, *args, chunk=16, precision="ieee")
    g32 = bwd.backward(dy16.float(), *[t.float() for t in x16], y16.float(), *args, chunk=16,
                       precision="ieee")
    for a, b in zip(g16[:3], g32[:3]):
        assert a.dtype == dtype
        if dtype == torch.float16:
            assert torch.equal(a, b.half())
        else:  # within one bf16 ulp (8 significant bits) of the fp32 value
            ulp = torch.ldexp(torch.ones_like(b), torch.frexp(b)[1] - 8)
            assert ((a.float() - b).abs() < ulp).all()
    assert torch.equal(g16[3], g32[3])


def test_deterministic_and_need_params():
    """Two calls give identical bits; need_params=False gives the same input gradients and
    None for the parameters."""
    q, k, v, user, keep = make_case("trig", 1, 2, 20, 20, 16, 3, 8, True, False, True, 8)
    params = user_to_canonical(user["w"], "trig", 0.25, user["bias"], user["lam"],
                               user["decay"])
    x = [t.reshape(2, 20, -1).float() for t in (q, k, v)]
    y = torch.randn(2, 20, 3, generator=torch.Generator().manual_seed(9))
    args = (*[t.float() for t in params[:4]], params[4], 2, True, keep, 2)
    a = bwd.backward(y * 0.5, *x, y, *args, chunk=16, precision="ieee")
    b = bwd.backward(y * 0.5, *x, y, *args, chunk=16, precision="ieee")
    c = bwd.backward(y * 0.5, *x, y, *args, chunk=16, precision="ieee", need_params=False)
    assert all(torch.equal(s, t) for s, t in zip(a, b))
    assert all(torch.equal(s, t) for s, t in zip(a[:3], c[:3])) and c[3:] == (None,) * 4


_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from favor.ops.attention.triton import gradients as B
import sys
sizes = ((64, 64), (128, 64), (64, 128), (128, 128), (64, 256))
for d, dv in (sizes if sys.argv[1] == "all" else sizes[:1]):
    bv = max(16, triton.next_power_of_2(dv))
    bt, bf = B._tiles(d, bv, 256, 64)
    for fn in (B._key_max_kernel, B._key_state_kernel, B._query_grad_kernel,
               B._feature_sums_kernel, B._key_grad_kernel):
        c = dict(KIND=1, HAS_BIAS=True, HAS_KLW=True, HAS_RATE=True, HAS_KEEP=True, CAUSAL=True,
                 PREC="tf32", D=d, BT=bt, BF=bf, BV=bv, NEED_PARAMS=True)
        c = {a: v for a, v in c.items() if a in fn.arg_names}
        sig = {n: "constexpr" if n in c else "*fp32" if n.endswith("_ptr") else
               "fp32" if n == "norm_coef" else "i32" for n in fn.arg_names}
        k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs={
            (fn.arg_names.index(a),): v for a, v in c.items()}), target=GPUTarget("cuda", 90, 32),
            options={"num_stages": 1})
        assert k.metadata.shared <= 232448, (fn.__name__, d, dv, k.metadata.shared)
"""


def test_kernels_compile_for_sm90_within_shared_memory():
    """The interpreter accepts what the GPU compiler may reject: compile every kernel for
    sm_90 (no GPU needed) with the tiles _tiles picks, and check each fits in 227 KB: at
    (D, Dv) = (64, 64) in CI (~13 s cold), at five sizes up to (128, 128) and (64, 256)
    with FAVOR_TRITON_COMPILE=1 (~1 min)."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    which = "all" if os.environ.get("FAVOR_TRITON_COMPILE") else "ci"
    run = subprocess.run([sys.executable, "-c", _COMPILE, which], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("causal", [False, True])
def test_heads_without_keys_get_zero_gradients(causal):
    """Every key of batch row 0 masked: its rows see no key (outputs defined as zeros), so
    all its gradients are exactly zero, and batch row 1 is unaffected."""
    q, k, v, user, _ = make_case("positive", 2, 1, 20, 20, 16, 3, 8, causal, False, False, 10)
    keep = torch.ones(2, 20, dtype=torch.bool)
    keep[0] = False
    params = user_to_canonical(user["w"].float(), "positive", 0.25)
    x = [t.reshape(2, 20, -1).float() for t in (q, k, v)]
    y = canonical(*[t.double() for t in x], *[t.double() for t in params[:1]], None, None,
                  None, params[4], 0, causal, keep, 1).float()
    dy = torch.randn(2, 20, 3, generator=torch.Generator().manual_seed(11))
    got = bwd.backward(dy, *x, y, *params[:4], params[4], 0, causal, keep, 1, chunk=16,
                       precision="ieee")
    for g in got[:3]:
        assert (g[0] == 0).all() and torch.isfinite(g).all() and (g[1] != 0).any()
    assert torch.isfinite(got[3]).all()


def test_bad_arguments_name_the_argument():
    x = torch.zeros(2, 16, 16)
    args = (x[..., :3], x, x, x[..., :3], x[..., :3], torch.zeros(1, 8, 16), None, None, None,
            0.0, 0)
    with pytest.raises(ValueError, match="keep"):
        bwd.backward(*args, False, torch.ones(1, 16, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="block_m"):
        bwd.backward(*args, False, None, 1, block_m=24)
    with pytest.raises(ValueError, match="causal"):
        bwd.backward(x[:, :5, :3], x[:, :5], x, x[..., :3], x[:, :5, :3], *args[5:], True, None, 1)
