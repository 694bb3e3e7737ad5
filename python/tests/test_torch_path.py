"""The torch path (backend='torch': plain torch operations, the path of every non-CPU device
without Triton; favor/ops/*/generic.py) against the C++ kernels and the float64 oracles,
on CPU tensors.

Tolerance (docs/numerics.md, rule 1): the float32 result's relative Frobenius error against
the float64 oracle (same projection) is at most twice that of a naive float32 evaluation of
the same formula (favor.torch.plain.attention_materialised in float32) plus 1e-6; gradients
likewise against float64 autograd through the oracle.
"""
import pytest
import torch

import favor
import favor.torch as ft
from favor.ops import decode_step, empty_state
from favor.torch.plain import attention_materialised, softmax_attention
from torch_helpers import frob, seeded_qkv, trig_bound


def projection(m, d, seed):
    """An orthogonal projection [m, d] as a float32 tensor (favor's draw)."""
    return torch.tensor(favor.make_projection(d, "orthogonal", features=m, seed=seed).matrix)


def padding(b, n, seed):
    """A key padding mask (True = ignore) with a padded prefix in row 1 and tail in row 0."""
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[0, n - n // 4:] = True
    if b > 1:
        mask[1, :max(1, n // 3)] = True
    return mask


CASES = [  # (kernel, learned map, causal, N, D, m)
    ("positive", False, False, 1, 16, 16), ("positive", False, True, 7, 16, 32),
    ("positive", False, True, 65, 32, 64), ("hyperbolic", False, False, 63, 16, 16),
    ("hyperbolic", False, True, 130, 16, 32), ("trig", False, False, 64, 32, 16),
    ("trig", False, True, 65, 16, 32), ("favorpp", False, True, 63, 16, 32),
    ("favorsharp", False, False, 65, 16, 16), ("hedgehog", True, True, 130, 16, 16),
    ("positive", True, True, 65, 32, 32), ("trig", True, False, 7, 16, 16),
]


def map_tensors(kernel, learned, h, m, d, seed):
    g = torch.Generator().manual_seed(100 + seed)
    w = projection(m, d, seed)
    if not learned:
        return w, None, None, None
    return (w, torch.randn(h, m, d, generator=g) * 0.4, torch.randn(h, m, generator=g) * 0.1,
            torch.rand(h, m, generator=g) + 0.5)


@pytest.mark.parametrize("kernel,learned,causal,n,d,m", CASES)
def test_torch_path_matches_cpp_and_reference(kernel, learned, causal, n, d, m):
    b, h, dv = 2, 2, 5
    q, k, v = seeded_qkv(b, h, n, d, dv, seed=n + d)
    mask = padding(b, n, n)
    w, wt, bias, lam = map_tensors(kernel, learned, h, m, d, n)
    fit = favor.fit_kernel(kernel, (q * 1.1).numpy(), (k * 0.9).numpy()) \
        if kernel in ("favorpp", "favorsharp") else None
    decay = torch.tensor([0.9, 0.97], dtype=torch.float64) if learned and causal else None
    kw = dict(causal=causal, kernel=kernel, projection=w, key_padding_mask=mask, fit=fit,
              weights=wt, bias=bias, feature_weights=lam, decay=decay)
    y_torch = ft.attention(q, k, v, backend="torch", **kw)
    y_cpp = ft.attention(q, k, v, **kw)

    def oracle(dtype):
        c = lambda t: None if t is None else t.to(dtype)
        return attention_materialised(c(q), c(k), c(v), c(wt if wt is not None else w), kernel,
                                      causal, None, ~mask, fit, c(bias), c(lam), decay)
    ref, naive = oracle(torch.float64), oracle(torch.float32)
    assert torch.isfinite(y_torch).all()
    if kernel == "trig" and not learned:
        # Rows whose denominator cancels: the elementwise derived bound (trig_bound), not the
        # 2x-naive rule, whose naive error varies 30x with the BLAS's kernel here.
        y_ref, bound = trig_bound(q, k, v, w, causal, ~mask)
        assert torch.allclose(y_ref, ref, rtol=1e-9, atol=1e-12)  # the same oracle
        for y in (y_torch, y_cpp):
            assert bool(((y.double() - ref).abs() <= bound).all()), float(
                ((y.double() - ref).abs() / bound).max())
        return
    bound = 2 * frob(naive, ref) + 1e-6
    assert frob(y_torch, ref) <= bound
    assert frob(y_cpp, ref) <= bound


@pytest.mark.parametrize("kernel,causal", [("positive", False), ("hyperbolic", True),
                                           ("trig", True), ("hedgehog", False)])
def test_torch_path_gradients(kernel, causal):
    """Gradients of q, k, v and every learned tensor (weights, bias, lambda, decay) by
    autograd through the torch path, against float64 autograd through the oracle (rule 1)
    and favor's C++ backward."""
    b, h, n, d, dv, m = 2, 2, 37, 16, 4, 16
    q, k, v = seeded_qkv(b, h, n, d, dv, seed=3)
    mask = padding(b, n, 1)
    _, wt, bias, lam = map_tensors(kernel, True, h, m, d, 1)
    decay = torch.tensor([0.9, 0.95], dtype=torch.float64) if causal else None
    leaves = [q, k, v, wt, bias, lam] + ([decay] if causal else [])
    dy = torch.randn(b, h, n, dv, generator=torch.Generator().manual_seed(9))

    def grads(fn, dtype):
        xs = [t.detach().to(dtype).requires_grad_() for t in leaves]
        y = fn(*xs)
        return torch.autograd.grad(y, xs, dy.to(dtype))

    def favor_fn(backend):
        def fn(q, k, v, wt, bias, lam, *dec):
            return ft.attention(q, k, v, causal=causal, kernel=kernel, key_padding_mask=mask,
                                weights=wt, bias=bias, feature_weights=lam,
                                decay=dec[0] if dec else None, backend=backend,
                                features=m)
        return fn

    def oracle(q, k, v, wt, bias, lam, *dec):
        return attention_materialised(q, k, v, wt, kernel, causal, None, ~mask, None, bias, lam,
                                      dec[0] if dec else None)
    ref, naive = grads(oracle, torch.float64), grads(oracle, torch.float32)
    torch_g, cpp_g = grads(favor_fn("torch"), torch.float32), grads(favor_fn(None), torch.float32)
    names = ["q", "k", "v", "weights", "bias", "lambda", "decay"]
    for name, gt, gc, gr, gn in zip(names, torch_g, cpp_g, ref, naive):
        if kernel == "trig" and name == "bias":
            continue  # cos(a_q - a_k): the bias cancels, its gradient is rounding noise
        bound = 2 * frob(gn, gr) + 1e-6
        assert frob(gt, gr) <= bound, name
        assert frob(gc, gr) <= max(bound, 2e-6), name


def test_projection_gradient_and_dtypes():
    """dL/dW of a projection tensor (FAVOR+), and bf16 / fp16 / f64 inputs computed in
    float32: the result equals the float32 call on the rounded inputs, in the input dtype."""
    q, k, v = seeded_qkv(1, 2, 20, 16, 4, seed=5)
    w = projection(32, 16, 1).requires_grad_()
    (gt,) = torch.autograd.grad(ft.attention(q, k, v, projection=w, causal=True,
                                             backend="torch").sum(), w)
    (gc,) = torch.autograd.grad(ft.attention(q, k, v, projection=w, causal=True).sum(), w)
    assert frob(gt, gc) < 1e-5
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        lo = [t.to(dtype) for t in (q, k, v)]
        y = ft.attention(*lo, backend="torch")
        assert y.dtype == dtype
        assert torch.equal(y, ft.attention(*[t.float() for t in lo], backend="torch").to(dtype))


@pytest.mark.parametrize("kernel", ["positive", "hyperbolic", "trig"])
def test_causal_row_is_decoder_after_appends(kernel):
    """Row i of causal attention = the decoder's query after appending tokens 0..i (the
    torch path's decode_step on the C++ state layout), with a decay and a padded row."""
    b, h, n, d, dv, m = 2, 2, 19, 16, 3, 16
    q, k, v = seeded_qkv(b, h, n, d, dv, seed=7)
    w = projection(m, d, 2)
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[1, :4] = True                                      # left padding in row 1
    gamma = torch.tensor([0.9, 0.99], dtype=torch.float64)
    wt = w.expand(h, m, d).contiguous()
    y = ft.attention(q, k, v, weights=wt, kernel=kernel, causal=True, decay=gamma,
                     key_padding_mask=mask, backend="torch", features=m)
    state = empty_state(b, h, dv, (1 if kernel == "positive" else 2) * m)
    rows = []
    for t in range(n):
        s = slice(t, t + 1)
        out, state = decode_step(state, q[:, :, s], k[:, :, s], v[:, :, s], w, kernel=kernel,
                                 key_mask=~mask[:, s], weights=wt, decay=gamma, backend="torch")
        rows.append(out)
    steps = torch.cat(rows, 2)
    # Row b = 1 has its clock advanced only by kept tokens: its decay counts kept tokens, as
    # in favor's Decoder (docs/api.md); compare row 0 (no padding) exactly, row 1 as its
    # own causal attention over the kept tokens.
    # docs/numerics.md rule 4: decoder vs causal batch, 1e-5 relative; trig rows whose
    # denominator cancels amplify rounding: each within its derived bound (trig_bound), so
    # the two within the sum of their bounds.
    def close(a, b, q, k, v):
        if kernel != "trig":
            return frob(a, b) < 1e-5
        _, bound = trig_bound(q, k, v, w, True, decay=gamma)
        return bool(((a.double() - b.double()).abs() <= 2 * bound).all())
    assert close(steps[:1], y[:1], q[:1], k[:1], v[:1])
    keep = ~mask[1]
    y1 = ft.attention(q[1:, :, keep], k[1:, :, keep], v[1:, :, keep], weights=wt, kernel=kernel,
                      causal=True, decay=gamma, backend="torch", features=m)
    assert close(steps[1:, :, keep], y1, q[1:, :, keep], k[1:, :, keep], v[1:, :, keep])
    assert torch.all(steps[1, :, :4] == 0)               # nothing visible yet: zeros


def test_chunk_size_invariance_and_large_norms():
    from favor.ops.attention import generic
    from favor.ops.attention.canonical import canonical_map
    q, k, v = seeded_qkv(1, 2, 70, 16, 4, seed=11)
    w = projection(16, 16, 0)
    cm = canonical_map(w, None, None, None, None, None, None, "positive", None, 16)
    flat = lambda t: t.reshape(-1, *t.shape[2:])
    ys = [generic.attention(flat(q), flat(k), flat(v), cm, None, True, c) for c in (1, 7, 16, 64, 128)]
    for y in ys[1:]:
        assert frob(y, ys[0]) < 2e-6
    for kernel in ("positive", "hyperbolic", "trig"):
        big = [t / t.norm(dim=-1, keepdim=True) * 1e3 for t in (q, k)]
        for causal in (False, True):
            y = ft.attention(*big, v, kernel=kernel, causal=causal, backend="torch")
            assert torch.isfinite(y).all()
            vmax = v.abs().amax()
            assert float(y.abs().max()) <= float(vmax) * (1 + 1e-5) or kernel == "trig"


def test_errors_are_the_cpp_ones():
    q, k, v = seeded_qkv(1, 2, 5, 8, 4, seed=0)
    bad = q.clone()
    bad[0, 1, 2, 3] = float("nan")
    cases = [dict(q=bad), dict(kernel="nope"), dict(scale=-1.0), dict(q=q[:, :, :4], causal=True),
             dict(decay=2.0, causal=True), dict(decay=0.9)]
    for case in cases:
        options = {x: y for x, y in case.items() if x != "q"}
        msgs = []
        for backend in (None, "torch"):
            with pytest.raises(favor.Error) as e:
                ft.attention(case.get("q", q), k, v, backend=backend, **options)
            msgs.append(str(e.value))
        assert msgs[0] == msgs[1], msgs
    with pytest.raises(favor.Error, match="backend: 'gpu' is not a backend"):
        ft.attention(q, k, v, backend="gpu")
    with pytest.raises(favor.Error, match="backend"):
        ft.FavorAttention(16, 2, backend="cuda")


def test_no_tensor_lands_on_the_default_device():
    """Every tensor the torch path creates follows the inputs' device: with the default
    device set to 'meta' (no data), a tensor created without device= would fail the call."""
    q, k, v = seeded_qkv(2, 2, 33, 16, 4, seed=1)
    mask = padding(2, 33, 0)
    cb = torch.randn(2, 8, 16)
    w = torch.randn(16, 16)
    with torch.device("meta"):
        for causal in (False, True):
            for kernel in ("positive", "trig", "hyperbolic"):
                ft.attention(q, k, v, causal=causal, key_padding_mask=mask, kernel=kernel,
                             backend="torch", features=16)
            ft.attention(q, k, v, causal=causal, key_padding_mask=mask, method="exact",
                         backend="torch")
            ft.vq_attention(q, k.clone().requires_grad_(), v, cb, causal=causal,
                            key_padding_mask=mask, backend="torch")
        ft.attention(q, k, v, causal=True, decay=0.9, weights=w.expand(2, 16, 16).clone(),
                     backend="torch")
        decode_step(empty_state(2, 2, 4, 16, device="cpu"), q[:, :, :1], k[:, :, :1],
                    v[:, :, :1], w, backend="torch")


@pytest.mark.parametrize("causal", [False, True])
def test_exact_path(causal):
    """method='exact' on the torch path (SDPA): the C++ result and the float64 softmax; rows
    that see no key are zeros with finite gradients."""
    q, k, v = seeded_qkv(2, 2, 24, 8, 4, seed=2)
    mask = padding(2, 24, 0)
    mask[1, :] = True                              # row 1 sees no key at all
    q.requires_grad_()
    y = ft.attention(q, k, v, method="exact", causal=causal, key_padding_mask=mask,
                     backend="torch")
    y_cpp = ft.attention(q, k, v, method="exact", causal=causal, key_padding_mask=mask)
    assert frob(y, y_cpp) < 1e-6
    assert torch.all(y[1] == 0)
    (g,) = torch.autograd.grad(y.sum(), q)
    assert torch.isfinite(g).all() and torch.all(g[1] == 0)
    keep = ~mask[0]
    ref = softmax_attention(q.detach().double()[:1, :, :, :], k.double()[:1, :, keep],
                            v.double()[:1, :, keep]) if not causal else None
    if causal:  # row i sees the kept keys <= i: the oracle row by row
        rows = [softmax_attention(q.detach().double()[:1, :, i:i + 1],
                                  k.double()[:1, :, :i + 1][:, :, keep[:i + 1]],
                                  v.double()[:1, :, :i + 1][:, :, keep[:i + 1]])
                for i in range(24)]
        ref = torch.cat(rows, 2)
    assert frob(y[:1], ref) < 1e-5


def test_decoder_and_modules_on_the_torch_path():
    """FavorAttention(backend='torch') trains and generates like the default path; its
    Decoder keeps the state as tensors (the C++ layout), selects rows, and a C++ state
    continues on the torch path to the same outputs."""
    torch.manual_seed(0)
    m = ft.FavorAttention(16, 2, causal=True, features=16, kernel="hedgehog",
                          learn_features=True, feature_weights=True, decay=[0.9, 0.8],
                          learn_decay=True)
    x = torch.randn(2, 9, 16)
    y_cpp = m(x)
    m.core.backend = "torch"
    y_t = m(x)
    assert frob(y_t, y_cpp) < 2e-6
    g_t = torch.autograd.grad(y_t.square().sum(), list(m.parameters()))
    m.core.backend = None
    g_c = torch.autograd.grad(m(x).square().sum(), list(m.parameters()))
    for a, c in zip(g_t, g_c):
        assert frob(a, c) < 1e-5
    m.eval()
    m.core.backend = "torch"
    with torch.no_grad():
        full = m(x)
        dec = m.decoder(2)
        steps = torch.cat([m.step(x[:, t:t + 1], dec) for t in range(5)], 1)
        assert frob(steps, full[:, :5]) < 2e-6 and dec.position == 5
        cpp = ft.FavorAttention(16, 2, causal=True, features=16).eval()
        d_cpp = cpp.decoder(2)
        for t in range(3):
            cpp.step(x[:, t:t + 1], d_cpp)
        d_t = ft.Decoder(2, 2, 8, cpp.core.projection, backend="torch")
        d_t.load_state(**d_cpp.state())
        d_t.select([1, 0])
        d_cpp.select([1, 0])
        xs = x.flip(0)
        for t in range(3, 6):
            a = cpp.step(xs[:, t:t + 1], d_cpp)
            b = cpp.step(xs[:, t:t + 1], d_t)
            assert frob(b, a) < 2e-6
        assert isinstance(d_t.state()["sums"], torch.Tensor) and d_t.position == 6


def test_vq_module_learns_on_the_torch_path():
    """VQAttention(backend='torch'): k-means, EMA and dead-code ops through the host
    round-trip kernels' logic give the codebook the C++ path gives."""
    from favor.ops._dispatch import on_host
    from favor.ops.codebook.op import codebook_ema_update_op
    torch.manual_seed(0)
    layers = [ft.VQAttention(16, 2, 8, causal=True, backend=b, seed=1) for b in (None, "torch")]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(2, 12, 16)
    for layer in layers:
        layer.train()
        layer(x).sum().backward()
    a, b = (layer.core.codebook for layer in layers)
    assert torch.equal(a, b)
    core = layers[0].core
    bufs = [core.codebook.clone(), core.ema_sum.clone(), core.ema_count.clone(),
            core.unused.clone()]
    copies = [t.clone() for t in bufs]
    k = torch.randn(2, 2, 12, 8)
    args = (k, None, torch.tensor(3), 0.9, 2, 7)
    n1 = codebook_ema_update_op(*bufs, *args)
    n2 = on_host(codebook_ema_update_op, "codebook_ema_update",
                 ("codebook", "ema_sum", "ema_count", "unused"))(*copies, *args)
    assert int(n1) == int(n2) and all(torch.equal(x, y) for x, y in zip(bufs, copies))


def test_masked_keys_never_reach_an_exponent():
    """A masked key's offset is taken against the kept keys' max and could overflow (right
    padding with decay: (j - last kept) * rate; a masked key of large norm for trig): it is
    -inf in the exponent, so outputs and gradients stay finite and equal the C++ kernels'."""
    n = 700
    q, k, v = seeded_qkv(1, 1, n, 8, 4, seed=12)
    mask = torch.zeros(1, n, dtype=torch.bool)
    mask[0, 60:] = True                              # 640 padded keys, gamma = 0.8: e^143
    k_big = k.clone()
    k_big[0, 0, 5] *= 100
    mask_big = torch.zeros(1, n, dtype=torch.bool)
    mask_big[0, 5] = True
    for kw, keys, m in ((dict(causal=True, decay=0.8), k, mask), (dict(kernel="trig"), k_big,
                                                                   mask_big)):
        grads = []
        for backend in (None, "torch"):
            qq = q.clone().requires_grad_()
            y = ft.attention(qq, keys, v, key_padding_mask=m, features=16, backend=backend, **kw)
            (g,) = torch.autograd.grad(y.square().sum(), qq)
            assert torch.isfinite(y).all() and torch.isfinite(g).all()
            grads.append((y, g))
        assert frob(grads[1][0], grads[0][0]) < 1e-5 and frob(grads[1][1], grads[0][1]) < 1e-4


def test_scale_and_step_mask_errors_on_the_torch_path():
    q, k, v = seeded_qkv(1, 1, 6, 8, 4, seed=0)
    for call in (lambda: ft.attention(q, k, v, method="exact", scale=-1.0, backend="torch"),
                 lambda: ft.vq_attention(q, k, v, torch.randn(4, 8), scale=-1.0,
                                         backend="torch")):
        with pytest.raises(favor.Error, match="scale: -1 must be finite and > 0"):
            call()
    state = empty_state(2, 1, 4, 16)
    x = torch.randn(2, 1, 1, 8)
    with pytest.raises(favor.Error, match=r"key_mask: shape \[2\] must be \[B, T\] = \[2,1\]"):
        decode_step(state, x, x, x[..., :4], torch.randn(16, 8),
                    key_mask=torch.ones(2, dtype=torch.bool), backend="torch")
