"""One conformance suite for favor's torch ops: every op, on every kernel it registers, against
the float64 oracle (ops/<op>/naive.py), forward and gradients.

The kernels come from the ops' own table (ops/_dispatch.py KERNELS: 'cpu' the C++ kernels,
'torch' plain torch operations, the default of every other device, 'triton' the fused
kernels, run here by Triton's interpreter on CPU tensors), plus 'cuda' (the dispatcher's
choice on CUDA tensors) when a GPU is present: a new kernel joins by registering itself,
and this file tests it with no change. 'cpu' runs through torch's dispatcher (CPU tensors,
backend=None), the others are forced with backend=.

Tolerance (docs/numerics.md, "How tolerances are derived", rule 4): a float32 evaluation of
a sum of N key terms over F features whose log-features are length-D dot products is within
(N + F + D) 2^-24 of the exact value relative to its size; TOL allows 4x that for the
stabiliser's shifts and the final division (relative Frobenius error against float64), and
the gradients, a second such evaluation chained on the first, twice TOL.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import functools  # noqa: E402
import importlib.util  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import favor  # noqa: E402
import favor.torch as ft  # noqa: E402
from favor import _core  # noqa: E402
from favor.ops import _dispatch  # noqa: E402
from favor.ops.attention import naive  # noqa: E402
from favor.ops.decoder import (DecodeState, VQDecodeState, advance, empty_state,  # noqa: E402
                               empty_vq_state, vq_advance)
from favor.ops.hybrid import (HybridDecodeState, empty_hybrid_state,  # noqa: E402
                              hybrid_advance)
from favor.ops.hybrid import naive as hybrid_naive  # noqa: E402
from favor.ops.exact.naive import softmax_attention  # noqa: E402
from favor.ops.vq.naive import vq_attention_materialised, vq_quantise  # noqa: E402
from torch_helpers import frob, seeded_qkv  # noqa: E402

torch.set_num_threads(1)

B, H, N, D, DV, M = 2, 2, 19, 16, 5, 16
U = 2.0 ** -24


def tol(features):
    return 4 * (N + features + D) * U


def kernels_of(op):
    """The kernels an op registers (its backend= names), and 'cuda' with a GPU."""
    names = [k for k in _dispatch.KERNELS[op]
             if k != "triton" or importlib.util.find_spec("triton") is not None]
    return names + (["cuda"] if torch.cuda.is_available() else [])


def place(kernel, tensors):
    """(tensors on the kernel's device, the backend= that selects it)."""
    if kernel == "cuda":
        return [None if t is None else t.cuda() for t in tensors], None
    return tensors, (None if kernel == "cpu" else kernel)


def leaves(tensors, dtype):
    return [None if t is None else t.detach().to(dtype).requires_grad_(t.is_floating_point())
            for t in tensors]


def check_grads(names, got, want, bound):
    for name, g, w in zip(names, got, want):
        assert g is not None and w is not None, name
        assert frob(g, w) < bound, (name, frob(g, w), bound)


def mask_of(n):
    """A key padding mask (True = ignore): row 1's first 4 keys (left padding)."""
    m = torch.zeros(B, n, dtype=torch.bool)
    m[1, :4] = True
    return m


# ---- favor::attention and its backward ---------------------------------------------------

ATTENTION_CASES = {
    "positive-bidirectional-mask": dict(kernel="positive", causal=False, mask=True),
    "hyperbolic-causal": dict(kernel="hyperbolic", causal=True, mask=False),
    "trig-causal-mask": dict(kernel="trig", causal=True, mask=True),
    "hedgehog-learned-decay": dict(kernel="hedgehog", causal=True, mask=True, learned=True),
    # hybrid attention: exact softmax on a window and sinks, the estimator beyond
    "positive-causal-hybrid": dict(kernel="positive", causal=True, mask=True, window=6, sinks=2),
    "trig-bidirectional-hybrid": dict(kernel="trig", causal=False, mask=True, window=5,
                                      sinks=2),
    "hedgehog-learned-decay-hybrid": dict(kernel="hedgehog", causal=True, mask=True,
                                          learned=True, window=4, sinks=1),
    # FAVOR++ / FAVOR# with no fit given: every kernel fits the call's q, k by C++'s rule
    "favorpp-unfitted-mask": dict(kernel="favorpp", causal=False, mask=True, fit="call"),
    "favorsharp-unfitted": dict(kernel="favorsharp", causal=False, mask=False, fit="call"),
    "favorpp-unfitted-hybrid": dict(kernel="favorpp", causal=False, mask=True, window=5,
                                    sinks=2, fit="call"),
}


def attention_inputs(case):
    q, k, v = seeded_qkv(B, H, N, D, DV, 3)
    g = torch.Generator().manual_seed(4)
    w = torch.randn(M, D, generator=g)
    maps = {}
    if case.get("learned"):
        maps = dict(weights=torch.randn(H, M, D, generator=g) * 0.3,
                    bias=torch.randn(H, M, generator=g) * 0.1,
                    feature_weights=torch.rand(H, M, generator=g) + 0.5,
                    decay=torch.tensor([0.9, 0.97], dtype=torch.float64))
    return q, k, v, w, maps


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
@pytest.mark.parametrize("kernel", kernels_of("attention"))
def test_attention(kernel, case):
    c = ATTENTION_CASES[case]
    q, k, v, w, maps = attention_inputs(c)
    mask = mask_of(N) if c["mask"] else None
    dy = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(5))
    names = ["q", "k", "v", *maps] if maps else ["q", "k", "v", "projection"]
    inputs = [q, k, v, *maps.values()] if maps else [q, k, v, w]

    # the float64 oracle: the formulas of docs/math.md, materialised
    ref = leaves(inputs, torch.float64)
    hybrid = {k: c[k] for k in ("window", "sinks") if k in c}
    oracle = (lambda *a, **kw: hybrid_naive.hybrid_attention(*a, **kw, **hybrid)) if hybrid \
        else naive.attention_materialised
    if c.get("fit") == "call":  # the fit C++ makes of the call's q and k (the oracle's too)
        fit = _core.fit_kernel(c["kernel"], q.numpy(), k.numpy(),
                               key_mask=None if mask is None else (~mask).numpy())
        oracle = functools.partial(oracle, fit=fit)
    if maps:
        wr, bias, lam, decay = ref[3:]
        y_ref = oracle(ref[0], ref[1], ref[2], wr, c["kernel"], c["causal"],
                       keep=None if mask is None else ~mask, bias=bias, lam=lam, decay=decay)
    else:
        y_ref = oracle(ref[0], ref[1], ref[2], ref[3], c["kernel"], c["causal"],
                       keep=None if mask is None else ~mask)
    g_ref = torch.autograd.grad(y_ref, ref, dy.double())

    xs, backend = place(kernel, leaves(inputs, torch.float32))
    (m_dev,), _ = place(kernel, [mask])
    if maps:
        kw = dict(zip(maps, xs[3:]))
        y = ft.attention(*xs[:3], kernel=c["kernel"], causal=c["causal"], features=M,
                         key_padding_mask=m_dev, backend=backend, **kw, **hybrid)
    else:
        y = ft.attention(*xs[:3], kernel=c["kernel"], causal=c["causal"], projection=xs[3],
                         key_padding_mask=m_dev, backend=backend, **hybrid)
    features = _core.feature_count(c["kernel"], M)
    assert y.dtype == torch.float32 and y.device == xs[0].device
    assert frob(y, y_ref) < tol(features), frob(y, y_ref)
    grads = torch.autograd.grad(y, xs, place(kernel, [dy])[0][0])
    if c["kernel"] == "trig" and maps:
        names, grads, g_ref = names[:3], grads[:3], g_ref[:3]
    check_grads(names, grads, g_ref, 2 * tol(features))


@pytest.mark.parametrize("kernel", kernels_of("attention"))
def test_a_kernel_name_is_one_estimator_on_every_kernel(kernel):
    """Each kernel name computes its own estimator on every registered kernel: FAVOR++ and
    FAVOR# without a fit (fitted inside the call) differ from FAVOR+ and from each other by
    far more than the float error, as their A != 0 says they must, and each name's result
    is the C++ kernel's on this kernel (never a silent substitution)."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (0.8 * torch.randn(B, H, N, D, generator=g) for _ in range(3))
    w = torch.randn(M, D, generator=g)
    (qd, kd, vd, wd), backend = place(kernel, [q, k, v, w])
    names = ("positive", "favorpp", "favorsharp", "trig", "hyperbolic")
    got = {n: ft.attention(qd, kd, vd, kernel=n, projection=wd, backend=backend).cpu()
           for n in names}
    cpu = {n: ft.attention(q, k, v, kernel=n, projection=w) for n in names}
    for n in names:
        assert frob(got[n], cpu[n]) < tol(_core.feature_count(n, M)), n
    for a, b in (("positive", "favorpp"), ("positive", "favorsharp"), ("favorpp", "favorsharp")):
        assert frob(got[a], got[b]) > 100 * tol(M), (a, b)


# ---- favor::exact_attention and its backward -----------------------------------------------

@pytest.mark.parametrize("causal,masked", [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize("kernel", kernels_of("exact_attention"))
def test_exact_attention(kernel, causal, masked):
    q, k, v = seeded_qkv(B, H, N, D, DV, 6)
    mask = mask_of(N) if masked else None
    dy = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(7))
    ref = leaves([q, k, v], torch.float64)
    y_ref = softmax_attention(*ref, causal=causal, keep=None if mask is None else ~mask)
    g_ref = torch.autograd.grad(y_ref, ref, dy.double())
    xs, backend = place(kernel, leaves([q, k, v], torch.float32))
    y = ft.attention(*xs, method="exact", causal=causal,
                     key_padding_mask=place(kernel, [mask])[0][0], backend=backend)
    assert frob(y, y_ref) < tol(N)
    check_grads("qkv", torch.autograd.grad(y, xs, place(kernel, [dy])[0][0]), g_ref,
                2 * tol(N))


# ---- favor::vq_attention and its backward --------------------------------------------------

@pytest.mark.parametrize("tau,causal", [(0.0, True), (0.5, False)])
@pytest.mark.parametrize("kernel", kernels_of("vq_attention"))
def test_vq_attention(kernel, tau, causal):
    q, k, v = seeded_qkv(B, H, N, D, DV, 8)
    codebook = torch.randn(H, 6, D, generator=torch.Generator().manual_seed(9)) * 0.7
    mask = mask_of(N)
    dy = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(10))
    ref = leaves([q, k, v, codebook], torch.float64)
    y_ref = vq_attention_materialised(*ref, causal=causal, keep=~mask, tau=tau)
    g_ref = torch.autograd.grad(y_ref, ref, dy.double())
    xs, backend = place(kernel, leaves([q, k, v, codebook], torch.float32))
    y = ft.vq_attention(*xs[:3], xs[3], causal=causal, tau=tau,
                        key_padding_mask=place(kernel, [mask])[0][0], backend=backend)
    assert frob(y, y_ref) < tol(6)
    check_grads(["q", "k", "v", "codebook"],
                torch.autograd.grad(y, xs, place(kernel, [dy])[0][0]), g_ref, 2 * tol(6))


def test_projection_is_the_cpp_draw():
    """favor::projection (one implementation for every device) draws the C++ library's
    matrix for (kind, m, d, norms, seed), bit for bit."""
    for kind in ("orthogonal", "iid", "qmc"):
        w = torch.ops.favor.projection(kind, M, D, "chi", 3)
        assert torch.equal(w, torch.tensor(favor.make_projection(D, kind, features=M,
                                                                 seed=3).matrix)), kind


def test_vq_assign_is_the_nearest_code():
    k = seeded_qkv(B, H, N, D, DV, 11)[1]
    codebook = torch.randn(H, 6, D, generator=torch.Generator().manual_seed(12))
    _, z = vq_quantise(k.double(), codebook.double())
    assert torch.equal(torch.ops.favor.vq_assign(k, codebook).long(), z)


# ---- favor::decode_step: one state, every mode ---------------------------------------------

DECODE_CASES = {
    "positive-padded": dict(kernel="positive", learned=False),
    "hedgehog-learned-decay": dict(kernel="hedgehog", learned=True),
}


@pytest.mark.parametrize("case", list(DECODE_CASES))
@pytest.mark.parametrize("kernel", kernels_of("decode_step"))
def test_decode_step(kernel, case):
    """Token by token ('step'), a prompt then tokens ('prefill' then 'step'), and
    'append' + 'query': every row equals row i of causal attention (the float64 oracle),
    left padding masked out, the state advanced in place on the kernel's device."""
    c = DECODE_CASES[case]
    q, k, v, w, maps = attention_inputs(dict(learned=c["learned"]))
    mask = mask_of(N)
    keep = ~mask
    ref = [t.double() for t in (q, k, v)]
    if maps:
        y_ref = naive.attention_materialised(
            *ref, maps["weights"].double(), c["kernel"], True, keep=keep,
            bias=maps["bias"].double(), lam=maps["feature_weights"].double(),
            decay=maps["decay"])
    else:
        y_ref = naive.attention_materialised(*ref, w.double(), c["kernel"], True, keep=keep)
    (qd, kd, vd, wd, keep_d), backend = place(kernel, [q, k, v, w, keep.long()])
    kw = dict(kernel=c["kernel"], backend=backend, weights=maps.get("weights"),
              bias=maps.get("bias"), feature_weights=maps.get("feature_weights"),
              decay=maps.get("decay"))
    features = _core.feature_count(c["kernel"], M)

    def fresh():
        return DecodeState(*(t.to(qd.device) for t in empty_state(B, H, DV, features)))

    state = fresh()
    ys = [advance(state, qd[:, :, i:i + 1], kd[:, :, i:i + 1], vd[:, :, i:i + 1], wd,
                  mode="step", key_mask=keep_d[:, i:i + 1], **kw) for i in range(N)]
    assert state.sums.device == qd.device and int(state.position[0]) == N
    y = torch.cat(ys, 2)
    visible = keep[:, None, :, None].expand(B, H, N, DV)  # padded rows attend to nothing
    assert frob(y * visible.to(y.device), y_ref * visible) < tol(features)

    split = 11
    state2 = fresh()
    y_pre = advance(state2, qd[:, :, :split], kd[:, :, :split], vd[:, :, :split], wd,
                    mode="prefill", key_mask=keep_d[:, :split], **kw)
    y_rest = [advance(state2, qd[:, :, i:i + 1], kd[:, :, i:i + 1], vd[:, :, i:i + 1], wd,
                      mode="step", key_mask=keep_d[:, i:i + 1], **kw) for i in range(split, N)]
    y2 = torch.cat([y_pre, *y_rest], 2)
    assert frob(y2 * visible.to(y2.device), y_ref * visible) < tol(features)
    for a, b in zip(state, state2):  # the same state, up to the order of its sums
        assert frob(a.double(), b.double()) < tol(features) or torch.equal(a, b)

    state3 = fresh()
    empty = advance(state3, qd[:, :, :0], kd, vd, wd, mode="append", key_mask=keep_d, **kw)
    assert empty.shape == (B, H, 0, DV)
    last = advance(state3, qd[:, :, N - 1:], kd[:, :, :0], vd[:, :, :0], wd, mode="query",
                   **kw)
    assert frob(last, y[:, :, N - 1:]) < tol(features)


@pytest.mark.parametrize("kernel", kernels_of("decode_step"))
def test_decode_step_with_decay_and_a_hole(kernel):
    """Masked tokens after a kept one, with decay: every kernel follows the op's rule (a
    row's decay clock ticks at every token from its first kept one on, so a key decays by
    the distance i - j): the prefill's rows and the token-by-token rows equal causal
    attention with the mask (the float64 oracle), and the two leave the same state."""
    q, k, v, w, maps = attention_inputs(dict(learned=True))
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[0, 5:8] = False       # a hole inside row 0
    keep[1, :3] = False        # left padding, then a hole
    keep[1, 9] = False
    kw = dict(kernel="hedgehog", weights=maps["weights"], bias=maps["bias"],
              feature_weights=maps["feature_weights"], decay=maps["decay"])
    features = _core.feature_count("hedgehog", M)
    y_ref = naive.attention_materialised(
        q.double(), k.double(), v.double(), maps["weights"].double(), "hedgehog", True,
        keep=keep, bias=maps["bias"].double(), lam=maps["feature_weights"].double(),
        decay=maps["decay"])
    (qd, kd, vd, wd, keep_d), backend = place(kernel, [q, k, v, w, keep.long()])
    kw["backend"] = backend

    def fresh():
        return DecodeState(*(t.to(qd.device) for t in empty_state(B, H, DV, features)))

    steps = fresh()
    y_steps = torch.cat([advance(steps, qd[:, :, i:i + 1], kd[:, :, i:i + 1],
                                 vd[:, :, i:i + 1], wd, mode="step",
                                 key_mask=keep_d[:, i:i + 1], **kw) for i in range(N)], 2)
    state = fresh()
    y = advance(state, qd, kd, vd, wd, mode="prefill", key_mask=keep_d, **kw)
    visible = keep[:, None, :, None].expand(B, H, N, DV)  # a masked row reads its last state
    for got in (y, y_steps):
        assert frob(got.cpu() * visible, y_ref * visible) < tol(features)
    for a, b in zip(state, steps):
        assert frob(a.double(), b.double()) < tol(features) or torch.equal(a, b)
    assert state.row_positions.tolist() == [N, N - 3]  # from each row's first kept token


HYBRID_DECODE_CASES = {
    "positive-w6-s2": dict(kernel="positive", learned=False, window=6, sinks=2, estimate=True),
    "positive-w0-s3": dict(kernel="positive", learned=False, window=0, sinks=3, estimate=True),
    "hedgehog-learned-decay-w4-s1": dict(kernel="hedgehog", learned=True, window=4, sinks=1,
                                         estimate=True),
    "window-alone-w5-s2": dict(kernel="positive", learned=False, window=5, sinks=2,
                               estimate=False),
    # decay and masked tokens after kept ones: they tick the clock, as the op's distance
    "hedgehog-learned-decay-holes-w3-s1": dict(kernel="hedgehog", learned=True, window=3,
                                               sinks=1, estimate=True, holes=True),
    # trig features (no shift: c = 0, signed) and no sinks
    "trig-w6-s0": dict(kernel="trig", learned=False, window=6, sinks=0, estimate=True),
}


@pytest.mark.parametrize("case", list(HYBRID_DECODE_CASES))
@pytest.mark.parametrize("kernel", kernels_of("hybrid_decode_step"))
def test_hybrid_decode_step(kernel, case):
    """favor::hybrid_decode_step token by token ('step'), a prompt then tokens ('prefill'
    then 'step') and 'append' + 'query': every row equals row i of causal hybrid attention
    (the float64 oracle, ops/hybrid/naive.py; the window alone: softmax over the window and
    the sinks), left padding masked out, the state advanced in place on the kernel's
    device."""
    c = HYBRID_DECODE_CASES[case]
    q, k, v, w, maps = attention_inputs(dict(learned=c["learned"]))
    mask = mask_of(N)
    if c.get("holes"):
        mask[0, 6:9] = True
        mask[1, 12] = True
    keep = ~mask
    ref = [t.double() for t in (q, k, v)]
    sizes = dict(window=c["window"], sinks=c["sinks"])
    if not c["estimate"]:  # the estimated terms weighed 0: softmax over the window and sinks
        y_ref = hybrid_naive.hybrid_attention(*ref, w.double(), "positive", True, keep=keep,
                                              lam=torch.zeros(1, M, dtype=torch.float64),
                                              **sizes)
    elif maps:
        y_ref = hybrid_naive.hybrid_attention(
            *ref, maps["weights"].double(), c["kernel"], True, keep=keep,
            bias=maps["bias"].double(), lam=maps["feature_weights"].double(),
            decay=maps["decay"], **sizes)
    else:
        y_ref = hybrid_naive.hybrid_attention(*ref, w.double(), c["kernel"], True, keep=keep,
                                              **sizes)
    (qd, kd, vd, wd, keep_d), backend = place(kernel, [q, k, v, w, keep.long()])
    kw = dict(kernel=c["kernel"], backend=backend, weights=maps.get("weights"),
              bias=maps.get("bias"), feature_weights=maps.get("feature_weights"),
              decay=maps.get("decay"), estimate=c["estimate"], **sizes)
    features = _core.feature_count(c["kernel"], M) if c["estimate"] else 0

    def fresh():
        return HybridDecodeState(*(t.to(qd.device) for t in empty_hybrid_state(
            B, H, DV, features, D, c["window"], c["sinks"])))

    state = fresh()
    ys = [hybrid_advance(state, qd[:, :, i:i + 1], kd[:, :, i:i + 1], vd[:, :, i:i + 1], wd,
                         mode="step", key_mask=keep_d[:, i:i + 1], **kw) for i in range(N)]
    assert state.sums.device == qd.device and int(state.position[0]) == N
    y = torch.cat(ys, 2)
    visible = keep[:, None, :, None].expand(B, H, N, DV)  # padded rows attend to nothing
    bound = tol(features + c["window"] + c["sinks"])
    assert frob(y * visible.to(y.device), y_ref * visible) < bound

    split = 11
    state2 = fresh()
    y_pre = hybrid_advance(state2, qd[:, :, :split], kd[:, :, :split], vd[:, :, :split], wd,
                           mode="prefill", key_mask=keep_d[:, :split], **kw)
    y_rest = [hybrid_advance(state2, qd[:, :, i:i + 1], kd[:, :, i:i + 1], vd[:, :, i:i + 1],
                             wd, mode="step", key_mask=keep_d[:, i:i + 1], **kw)
              for i in range(split, N)]
    y2 = torch.cat([y_pre, *y_rest], 2)
    assert frob(y2 * visible.to(y2.device), y_ref * visible) < bound
    for a, b in zip(state, state2):  # the same state, up to the order of its sums
        assert torch.equal(a, b) or frob(a.double(), b.double()) < bound

    state3 = fresh()
    empty = hybrid_advance(state3, qd[:, :, :0], kd, vd, wd, mode="append", key_mask=keep_d,
                           **kw)
    assert empty.shape == (B, H, 0, DV)
    last = hybrid_advance(state3, qd[:, :, N - 1:], kd[:, :, :0], vd[:, :, :0], wd,
                          mode="query", **kw)
    assert frob(last, y[:, :, N - 1:]) < bound


def test_hybrid_decode_state_errors_name_the_field():
    q, k, v, w, _ = attention_inputs({})
    state = empty_hybrid_state(B, H, DV, M, D, 4, 1)
    bad = HybridDecodeState(*state[:4], state.ring_k[:, :, :2], *state[5:])
    for backend in ("cpu", "torch"):
        with pytest.raises(favor.Error, match=r"state.ring_k: torch.float32 \[2, 2, 2, 16\] "
                                              r"must be float32 \[2, 2, 4, 16\]"):
            hybrid_advance(bad, q[:, :, :1], k[:, :, :1], v[:, :, :1], w, window=4, sinks=1,
                           backend=backend)
    with pytest.raises(favor.Error, match="state: must be a HybridDecodeState"):
        hybrid_advance(state[:4], q[:, :, :1], k[:, :, :1], v[:, :, :1], w, window=4, sinks=1)


def test_decoder_errors_name_the_argument():
    q, k, v, w, _ = attention_inputs({})
    state = empty_state(B, H, DV, M)
    with pytest.raises(favor.Error, match="a step takes one token per row"):
        advance(state, q[:, :, :3], k[:, :, :3], v[:, :, :3], w, mode="step", backend="torch")
    bad = DecodeState(state.sums, state.log_max.float(), state.row_positions, state.position)
    with pytest.raises(favor.Error, match="state.log_max: dtype torch.float32"):
        advance(bad, q[:, :, :1], k[:, :, :1], v[:, :, :1], w, backend="torch")
    with pytest.raises(favor.Error, match=r"projection: shape \[16, 8\]"):
        advance(state, q[:, :, :1], k[:, :, :1], v[:, :, :1], w[:, :8], backend="torch")
    y = advance(state, q[:, :, :1], k[:, :, :1], v[:, :, :1], w, key_mask=[[1], [0]])
    assert y.shape == (B, H, 1, DV)
    with pytest.raises(favor.Error, match="state: must be a VQDecodeState"):
        vq_advance(None, q[:, :, :1], k[:, :, :1], v[:, :, :1], torch.randn(H, 6, D))


@pytest.mark.parametrize("tau", [0.0, 0.5])
@pytest.mark.parametrize("kernel", kernels_of("vq_decode_step"))
def test_vq_decode_step(kernel, tau):
    """favor::vq_decode_step token by token and as a prefill: every row equals row i of
    causal Transformer-VQ (the float64 oracle), left padding masked out."""
    q, k, v = seeded_qkv(B, H, N, D, DV, 14)
    codebook = torch.randn(H, 6, D, generator=torch.Generator().manual_seed(15)) * 0.7
    keep = ~mask_of(N)
    y_ref = vq_attention_materialised(q.double(), k.double(), v.double(), codebook.double(),
                                      causal=True, keep=keep, tau=tau)
    (qd, kd, vd, cd, keep_d), backend = place(kernel, [q, k, v, codebook, keep.long()])
    visible = keep[:, None, :, None].expand(B, H, N, DV)

    def fresh():
        return VQDecodeState(*(t.to(qd.device) for t in empty_vq_state(B, H, DV, 6)))

    state = fresh()
    ys = [vq_advance(state, qd[:, :, i:i + 1], kd[:, :, i:i + 1], vd[:, :, i:i + 1], cd,
                     mode="step", tau=tau, key_mask=keep_d[:, i:i + 1], backend=backend)
          for i in range(N)]
    y = torch.cat(ys, 2)
    assert state.sums.device == qd.device and int(state.position[0]) == N
    assert frob(y * visible.to(y.device), y_ref * visible) < tol(6)
    state2 = fresh()
    y2 = vq_advance(state2, qd, kd, vd, cd, mode="prefill", tau=tau, key_mask=keep_d,
                    backend=backend)
    assert frob(y2 * visible.to(y2.device), y_ref * visible) < tol(6)
    for a, b in zip(state, state2):
        assert frob(a.double(), b.double()) < tol(6)


# ---- what the dispatcher holds -------------------------------------------------------------

def test_every_op_has_a_kernel_for_cuda_or_every_device():
    """Torch's dispatcher holds, for every favor op, a CUDA kernel or a default one (the
    device choice is torch's, not favor's): a call on a CUDA tensor never fails for want of
    a kernel."""
    import favor.ops.sequence_parallel  # noqa: F401 (registers the sequence-parallel ops)
    ops = [name for name in dir(torch.ops.favor)
           if isinstance(getattr(torch.ops.favor, name, None), torch._ops.OpOverloadPacket)]
    assert len(ops) >= 16, ops
    for name in ops:
        qualified = f"favor::{name}"
        has = [key for key in ("CUDA", "CompositeExplicitAutograd")
               if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)]
        assert has, f"{qualified} has no CUDA or default kernel"
        assert torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CPU") or \
            "CompositeExplicitAutograd" in has


def test_forced_backend_errors():
    q, k, v = seeded_qkv(1, 1, 8, 16, 4, 13)
    with pytest.raises(favor.Error, match="backend: 'gpu' is not a backend"):
        ft.attention(q, k, v, backend="gpu")
    with pytest.raises(favor.Error, match="backend: 'gpu' is not a backend"):
        ft.vq_attention(q, k, v, torch.randn(4, 16), backend="gpu")
