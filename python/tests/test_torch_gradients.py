"""favor.torch.attention's values and gradients against torch autograd through the plain
float64 formula (favor.torch.plain.attention_materialised) with the same projection.

Tolerance (docs/numerics.md): favor computes in float32, so its error against the float64
oracle is judged against the error of the same plain formula evaluated by autograd in
float32 on the same float32-rounded inputs: favor's must be at most 2x that, plus a floor
of 1e-6 relative (a few float32 ulps, for cases where the naive float32 run happens to be
almost exact).
"""
import pytest
import torch

import favor
import favor.torch as ft
from favor.torch import plain
from torch_helpers import KERNELS, fit_for, qkv, rel


def _plain_grads(q, k, v, w, g, **opt):
    ts = [t.detach().clone().requires_grad_() for t in (q, k, v, w)]
    y = plain.attention_materialised(*ts, **opt)
    (y * g.to(y.dtype)).sum().backward()
    return y.detach(), [t.grad for t in ts]


def _favor_grads(q, k, v, w, g, mask, **opt):
    ts = [t.detach().float().clone().requires_grad_() for t in (q, k, v, w)]
    y = ft.attention(*ts[:3], projection=ts[3], key_padding_mask=mask, **opt)
    (y * g.float()).sum().backward()
    return y.detach(), [t.grad for t in ts]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_values_and_gradients_match_plain_float64(kernel, causal, masked):
    q, k, v = qkv(seed=3)
    w = torch.from_numpy(favor.Projection.draw(16, 6, seed=5).matrix.copy()).double()
    fit = fit_for(kernel, q, k)
    ignore = torch.zeros(2, 12, dtype=torch.bool)
    if masked:
        ignore[0, 7:] = True
        ignore[1, ::3] = True
    keep = (~ignore).numpy()
    g = torch.randn(2, 2, 12, 5, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    opt = dict(kernel=kernel, causal=causal, fit=fit)
    exact_y, exact_g = _plain_grads(q, k, v, w, g, keep=keep, **opt)
    r32 = [t.float().double() for t in (q, k, v, w)]  # the float32-rounded inputs
    ref_y, ref_g = _plain_grads(*r32, g, keep=keep, **opt)  # oracle on what favor sees
    naive_y, naive_g = _plain_grads(*[t.float() for t in (q, k, v, w)], g.float(), keep=keep, **opt)
    y, grads = _favor_grads(q, k, v, w, g, ignore if masked else None, **opt)
    assert y.dtype == torch.float32
    assert rel(y, ref_y) <= 2 * rel(naive_y, ref_y) + 1e-6
    names = ["dq", "dk", "dv", "dW"]
    for name, got, want, naive in zip(names, grads, ref_g, naive_g):
        assert got is not None, name
        assert rel(got, want) <= 2 * rel(naive, want) + 1e-6, (name, rel(got, want), rel(naive, want))
    del exact_y, exact_g


def test_projection_given_as_kind_or_projection_is_the_same_draw():
    q, k, v = (t.float() for t in qkv())
    w = favor.Projection.draw(32, 6, kind="iid", seed=7)
    a = ft.attention(q, k, v, projection="iid", features=32, seed=7)
    b = ft.attention(q, k, v, projection=w)
    c = ft.attention(q, k, v, projection=torch.from_numpy(w.matrix.copy()))
    assert torch.equal(a, b) and torch.equal(a, c)
    assert torch.equal(a, torch.from_numpy(favor.attention(q.numpy(), k.numpy(), v.numpy(),
                                                           projection=w)))


def test_saved_context_gives_the_gradients_of_a_recomputation():
    """The forward saves the key state (bidirectional); the backward with it equals the
    numpy API's backward without it, bit for bit."""
    q, k, v = (t.float().requires_grad_() for t in qkv(n=40))
    y = ft.attention(q, k, v, features=32, seed=1)
    g = torch.randn_like(y)
    (y * g).sum().backward()
    ref = favor.attention_backward(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(),
                                   g.numpy(), features=32, seed=1)
    for got, want in zip((q.grad, k.grad, v.grad), ref[:3]):
        assert torch.equal(got, torch.from_numpy(want))


@pytest.mark.parametrize("kernel", ["positive", "favorsharp"])
def test_saved_causal_states_give_the_gradients_of_a_recomputation(kernel):
    """save_causal_states: the forward keeps the chunk states and rows (N = 70: two full
    32-token chunks and a partial one) and the backward's one sweep gives the gradients of
    the recomputing backward (without the option) to rounding (dW's summation order)."""
    q, k, v = qkv(n=70)
    fit = fit_for(kernel, q, k)
    grads = []
    for save in (False, True):
        ts = [t.float().clone().requires_grad_() for t in (q, k, v)]
        y = ft.attention(*ts, causal=True, kernel=kernel, features=32, seed=1, fit=fit,
                         save_causal_states=save)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        grads.append([t.grad for t in ts])
    for plain_grad, saved_grad in zip(*grads):
        assert rel(saved_grad, plain_grad) <= 1e-6
    # The context the op carries: 4 chunk states (3 chunks and the final one) of F x (Dv + 1)
    # floats per head, their maxima, and 70 rows of Dv + 1.
    w = favor._core.Projection.draw(32, 6)
    *_, ctx = favor._core.attention(*(t.float().numpy() for t in (q, k, v)), w, kernel=kernel,
                                    causal=True, fit=fit, save_context=True,
                                    save_causal_states=True)
    assert favor._core.causal_context_states(70) == 4
    assert ctx.valid and ctx.states.size == 4 * 4 * 32 * 6 and ctx.rows.size == 4 * 70 * 6


def test_exact_method_matches_plain_softmax_and_its_gradients():
    q, k, v = qkv(seed=2)
    for causal in (False, True):
        ts = [t.float().clone().requires_grad_() for t in (q, k, v)]
        y = ft.attention(*ts, method="exact", causal=causal)
        y.sum().backward()
        rs = [t.clone().requires_grad_() for t in (q, k, v)]
        yr = plain.softmax_attention(*rs, causal=causal)
        yr.sum().backward()
        assert rel(y, yr) < 1e-5
        for a, b in zip(ts, rs):
            assert rel(a.grad, b.grad) < 1e-4  # float32 scores through dS = P (dP - D)


def test_strided_inputs_equal_contiguous_ones():
    q, k, v = (t.float() for t in qkv(n=20))
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not qt.is_contiguous()
    assert torch.equal(ft.attention(qt, k, v), ft.attention(q, k, v))
    assert torch.equal(ft.attention(q[:, :, ::2], k[:, :, ::2], v[:, :, ::2]),
                       ft.attention(q[:, :, ::2].contiguous(), k[:, :, ::2].contiguous(),
                                    v[:, :, ::2].contiguous()))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtypes_compute_in_float32_and_return_their_dtype(dtype):
    q, k, v = qkv()
    qd, kd, vd = (t.to(dtype).requires_grad_() for t in (q, k, v))
    y = ft.attention(qd, kd, vd)
    assert y.dtype == dtype
    y32 = ft.attention(*(t.detach().float() for t in (qd, kd, vd)))
    assert torch.equal(y, y32.to(dtype))
    y.float().sum().backward()
    assert qd.grad.dtype == dtype and kd.grad.dtype == dtype and vd.grad.dtype == dtype


def test_double_backward_is_refused():
    q, k, v = (t.float().requires_grad_() for t in qkv())
    y = ft.attention(q, k, v)
    (gq,) = torch.autograd.grad(y.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        gq.sum().backward()


@pytest.mark.parametrize("bad, match", [
    (lambda q: q.int(), "q: dtype torch.int32 is not a float type"),
    (lambda q: q.to("meta"), "q: tensor on device 'meta'"),
    (lambda q: q.to_sparse(), "q: layout"),
    (lambda q: q.numpy(), "q: expected a torch.Tensor"),
])
def test_bad_tensors_raise_a_clear_value_error(bad, match):
    q, k, v = (t.float() for t in qkv())
    with pytest.raises(ValueError, match=match):
        ft.attention(bad(q), k, v)


def test_library_errors_come_through_as_favor_errors():
    q, k, v = (t.float() for t in qkv())
    with pytest.raises(favor.Error, match="head dim"):
        ft.attention(q, k[..., :5], v)
    q2 = q.clone()
    q2[0, 1, 2, 3] = float("nan")
    with pytest.raises(favor.Error, match="nan"):
        ft.attention(q2, k, v)
    with pytest.raises(favor.Error, match="key_padding_mask"):
        ft.attention(q, k, v, key_padding_mask=torch.zeros(2, 12, dtype=torch.int64))
    with pytest.raises(favor.Error, match="key_padding_mask"):
        ft.attention(q, k, v, key_padding_mask=torch.full((2, 12), -1.0))
    with pytest.raises(favor.Error, match="fit"):
        ft.attention(q, k, v, kernel="favorpp", causal=True)


def test_float_key_padding_mask_equals_bool_mask():
    q, k, v = (t.float() for t in qkv())
    ignore = torch.zeros(2, 12, dtype=torch.bool)
    ignore[:, 9:] = True
    additive = torch.zeros(2, 12).masked_fill(ignore, float("-inf"))
    assert torch.equal(ft.attention(q, k, v, key_padding_mask=ignore),
                       ft.attention(q, k, v, key_padding_mask=additive))


@pytest.mark.parametrize("causal", [False, True])
def test_plain_linear_favor_plus_equals_the_materialised_formula(causal):
    """The benchmark's plain-torch baseline computes FAVOR+ (stabilised, chunked), not
    something cheaper: in float64 it equals the materialised formula to rounding, with N
    not a multiple of the chunk, values and gradients."""
    q, k, v = qkv(n=75, seed=4)
    w = torch.from_numpy(favor.Projection.draw(16, 6, seed=2).matrix.copy()).double()
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.clone().requires_grad_() for t in (q, k, v)]
    ya = plain.favor_plus(*a, w, causal=causal, chunk=16)
    yb = plain.attention_materialised(*b, w, causal=causal)
    assert rel(ya, yb) < 1e-12
    ya.sum().backward()
    yb.sum().backward()
    for x, y in zip(a, b):
        assert rel(x.grad, y.grad) < 1e-10
