"""favor.torch's Transformer-VQ: vq_attention's values and gradients against torch autograd
through the plain float64 formula (plain.vq_attention_materialised: straight-through for
hard VQ, exact for soft), VQAttention (forward, backward, EMA, commitment loss, state_dict,
decoder/step), VQMultiheadAttention and convert(method='vq').

Tolerance as test_torch_gradients.py: favor's error against the float64 oracle (on the
float32-rounded inputs) is at most 2x that of the same plain formula run by autograd in
float32, plus 1e-6 relative.
"""
import numpy as np
import pytest
import torch
from torch import nn

import favor
import favor.torch as ft
from favor.torch import plain
from torch_helpers import qkv, rel


def _plain(q, k, v, book, g, **opt):
    ts = [t.detach().clone().requires_grad_() for t in (q, k, v, book)]
    y = plain.vq_attention_materialised(*ts, **opt)
    (y * g.to(y.dtype)).sum().backward()
    return y.detach(), [t.grad for t in ts]


@pytest.mark.parametrize("tau", [0.0, 0.5], ids=["hard", "soft"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("shared", [False, True], ids=["per_head", "shared"])
def test_values_and_gradients_match_plain_float64(tau, causal, masked, shared):
    q, k, v = qkv(seed=3, n=14)
    gen = torch.Generator().manual_seed(4)
    book = torch.randn((4, 6) if shared else (2, 4, 6), generator=gen, dtype=torch.float64) * 0.6
    ignore = torch.zeros(2, 14, dtype=torch.bool)
    if masked:
        ignore[0, 9:] = True
        ignore[1, 1::3] = True
    keep = (~ignore).numpy()
    g = torch.randn(2, 2, 14, 5, generator=gen, dtype=torch.float64)
    opt = dict(causal=causal, tau=tau, keep=keep)
    r32 = [t.float().double() for t in (q, k, v, book)]
    ref_y, ref_g = _plain(*r32, g, **opt)
    naive_y, naive_g = _plain(*[t.float() for t in (q, k, v, book)], g.float(), **opt)
    ts = [t.float().clone().requires_grad_() for t in (q, k, v, book)]
    y = ft.vq_attention(*ts[:3], ts[3], causal=causal, tau=tau,
                        key_padding_mask=ignore if masked else None)
    (y * g.float()).sum().backward()
    assert y.dtype == torch.float32
    assert rel(y, ref_y) <= 2 * rel(naive_y, ref_y) + 1e-6
    for name, t, want, naive in zip(["dq", "dk", "dv", "dcodebook"], ts, ref_g, naive_g):
        assert t.grad is not None and t.grad.shape == t.shape, name
        assert rel(t.grad, want) <= 2 * rel(naive, want) + 1e-6, (name, rel(t.grad, want),
                                                                    rel(naive, want))


def test_hard_dk_is_the_straight_through_gradient():
    # dk of hard VQ equals the gradient with respect to the quantised keys k^ = C_z (and is
    # not the gradient of attention over the raw keys).
    q, k, v = qkv(seed=5, n=10)
    book = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    khat, _ = plain.vq_quantise(k, book)
    khat = khat.detach().requires_grad_()
    plain.softmax_attention(q, khat, v).sum().backward()
    kf = k.float().requires_grad_()
    ft.vq_attention(q.float(), kf, v.float(), book.float()).sum().backward()
    assert rel(kf.grad, khat.grad) < 1e-5
    kr = k.clone().requires_grad_()
    plain.softmax_attention(q, kr, v).sum().backward()
    assert rel(kf.grad, kr.grad) > 0.05


def test_float64_in_float64_out_and_no_codebook_grad_unless_asked():
    q, k, v = qkv(seed=7)
    book = torch.randn(2, 3, 6, dtype=torch.float64)
    qq = q.clone().requires_grad_()
    y = ft.vq_attention(qq, k, v, book)
    assert y.dtype == torch.float64
    y.sum().backward()
    assert qq.grad is not None and book.grad is None


def model_input(b=2, n=12, e=16, seed=0):
    return torch.randn(b, n, e, generator=torch.Generator().manual_seed(seed))


def test_module_initialises_by_kmeans_and_learns_by_ema():
    torch.manual_seed(0)
    m = ft.VQAttention(16, 2, 8, causal=True, dead_after=3)
    x = model_input()
    assert not bool(m.initialised)
    y = m(x)
    assert y.shape == x.shape and bool(m.initialised) and int(m.updates) == 1
    k = m._heads(m.k_proj(x)).detach()
    # The first batch's k-means codebook (taken before this forward's EMA step would move it):
    fresh = ft.VQAttention(16, 2, 8, causal=True)
    fresh.load_state_dict({n: p for n, p in m.state_dict().items() if "proj" in n}, strict=False)
    fresh.eval()
    fresh(x)
    want = favor.Codebook.kmeans(np.ascontiguousarray(
        k.permute(1, 0, 2, 3).reshape(1, 2, -1, 8).numpy()), 8).values
    assert np.array_equal(fresh.codebook.numpy(), want)
    # The EMA step after k-means on the same keys keeps the codes (they are the means of
    # their keys already: Lloyd converged); a training step on other keys moves them, and
    # eval-mode calls do not.
    torch.testing.assert_close(m.codebook, fresh.codebook, rtol=0, atol=1e-6)
    m(model_input(seed=1))
    assert not torch.allclose(m.codebook, fresh.codebook, rtol=0, atol=1e-3)
    m.eval()
    before = m.codebook.clone()
    m(x)
    assert torch.equal(m.codebook, before) and int(m.updates) == 2
    # Commitment loss: beta mean |k - C_z|^2, the value favor.commitment_loss gives.
    want = favor.commitment_loss(k.numpy(), m.codebook.numpy(), beta=0.25).loss
    assert m.commitment_loss.item() == pytest.approx(want, rel=1e-5)


def test_module_backward_reaches_projections_and_commitment_reaches_k_proj():
    torch.manual_seed(1)
    m = ft.VQAttention(16, 2, 6)
    x = model_input().requires_grad_()
    (m(x).pow(2).sum() + m.commitment_loss).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    m.zero_grad(set_to_none=True)
    m(x)
    m.commitment_loss.backward()
    assert m.k_proj.weight.grad.abs().sum() > 0 and m.q_proj.weight.grad is None


def test_grad_learned_codebook_receives_gradients():
    torch.manual_seed(2)
    m = ft.VQAttention(16, 2, 6, learn_codebook="grad")
    assert isinstance(m.codebook, nn.Parameter)
    m(model_input()).sum().backward()
    assert m.codebook.grad is not None and m.codebook.grad.abs().sum() > 0


def test_grad_learned_codebook_gradient_is_that_of_the_forward_codebook():
    # A training step in which dead codes are moved onto keys after the forward: the
    # gradient is still the functional one at the codebook the forward used, and the codes
    # are re-seeded from unmasked keys only, distinct ones.
    torch.manual_seed(8)
    m = ft.VQAttention(16, 2, 6, learn_codebook="grad", dead_after=1)
    x = model_input(b=2, n=12)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[:, 8:] = True
    with torch.no_grad():
        x[:, 8:] = 50.0  # padding far away: a re-seeded code on it would be obvious
    m(x, key_padding_mask=pad)
    with torch.no_grad():
        m.codebook[:, 4:] += 1e3  # codes 4, 5 of both heads: no key chooses them
    used = m.codebook.detach().clone()
    before = m.codes_reset
    y = m(x, key_padding_mask=pad)
    assert m.codes_reset - before >= 4  # codes 4, 5 of both heads, right after this forward
    g = torch.randn_like(y)
    (y * g).sum().backward()
    # The reference: the same step with the codebook as the forward saw it.
    ref = ft.VQAttention(16, 2, 6, learn_codebook="grad", dead_after=0)
    ref.load_state_dict({n: t for n, t in m.state_dict().items()})
    with torch.no_grad():
        ref.codebook.copy_(used)
    ref.eval()  # no reset, no tracking: only the attention's gradient
    (ref(x, key_padding_mask=pad) * g).sum().backward()
    torch.testing.assert_close(m.codebook.grad, ref.codebook.grad, rtol=1e-5, atol=1e-6)
    moved = m.codebook.detach()[:, 4:]
    assert moved.abs().max() < 20  # from unmasked keys (padding keys have norms ~ 100s)
    for head in range(2):
        assert not torch.equal(moved[head, 0], moved[head, 1])


def test_state_dict_round_trip_and_decoder_step_equal_causal_forward():
    torch.manual_seed(3)
    m = ft.VQAttention(16, 2, 8, causal=True, tau=0.0)
    x = model_input(b=2, n=9)
    for _ in range(3):
        m(x)
    m.eval()
    y = m(x)
    twin = ft.VQAttention(16, 2, 8, causal=True)
    twin.load_state_dict(m.state_dict())
    twin.eval()
    assert bool(twin.initialised) and torch.equal(twin(x), y)
    assert torch.equal(twin.unused, m.unused) and int(twin.updates) == 3
    dec = m.decoder(2)
    rows = [m.step(x[:, :4], dec)] + [m.step(x[:, i:i + 1], dec) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(rows, 1), y, rtol=0, atol=2e-6)
    assert dec.position == 9


def test_dead_codes_are_reset_after_dead_after_batches():
    torch.manual_seed(4)
    m = ft.VQAttention(16, 1, 6, dead_after=2)
    x = model_input(b=1, n=10)
    m(x)
    with torch.no_grad():
        m.codebook[0, 5] += 1e4  # unreachable: no key chooses it
        m.ema_sum[0, 5] = m.codebook[0, 5]
    m(x)
    assert m.unused[0, 5] == 1 and m.dead_codes() >= 1
    m(x)
    assert m.codes_reset >= 1 and m.unused[0, 5] == 0
    assert m.codebook[0, 5].abs().max() < 1e3


def test_vq_multihead_attention_and_convert():
    torch.manual_seed(5)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2)
    replaced = ft.convert(model, method="vq", codes=8)
    assert sorted(replaced) == ["layers.0.self_attn", "layers.1.self_attn"]
    attn = model.layers[0].self_attn
    assert isinstance(attn, ft.VQMultiheadAttention) and attn.codes == 8
    assert torch.equal(attn.in_proj_weight, replaced["layers.0.self_attn"].in_proj_weight)
    x = model_input(n=10)
    model(x).sum().backward()
    assert bool(attn.initialised) and attn.in_proj_weight.grad is not None
    # It is VQ over the torch module's projections: the same as VQAttention with those
    # weights and codebook.
    mha = replaced["layers.0.self_attn"]
    ref = ft.VQAttention(16, 2, 8, batch_first=True)
    w, b = mha.in_proj_weight, mha.in_proj_bias
    sd = {"q_proj.weight": w[:16], "k_proj.weight": w[16:32], "v_proj.weight": w[32:],
          "q_proj.bias": b[:16], "k_proj.bias": b[16:32], "v_proj.bias": b[32:],
          "out_proj.weight": mha.out_proj.weight, "out_proj.bias": mha.out_proj.bias}
    sd.update({n: t for n, t in attn.state_dict().items() if "proj" not in n})
    ref.load_state_dict(sd)
    attn.eval()
    ref.eval()
    y, none = attn(x, x, x, need_weights=False)
    assert none is None
    torch.testing.assert_close(y, ref(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("make, name", [
    (lambda: ft.VQAttention(16, 2, 0), "codes"),
    (lambda: ft.VQAttention(16, 2, 4, learn_codebook="adam"), "learn_codebook"),
    (lambda: ft.VQAttention(16, 2, 4, decay=1.0), "decay"),
    (lambda: ft.VQAttention(16, 2, 4, tau=-1.0), "tau"),
    (lambda: ft.VQAttention(16, 3, 4), "num_heads"),
    (lambda: ft.VQAttention(16, 2, 4).decoder(1), "codebook"),
    (lambda: ft.vq_attention(*qkv()[:3], torch.zeros(2, 3, 5)), "codebook"),
    (lambda: ft.vq_attention(*qkv()[:3], torch.zeros(3, 6, dtype=torch.int32)), "codebook"),
])
def test_errors_name_the_argument(make, name):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value).startswith(name + ":"), str(e.value)


def test_vq_attention_seed_above_2_63_trains():
    """favor's seeds are unsigned 64-bit; the codebook ops carry them as int64 (two's
    complement) and take them back: with a seed >= 2^63 the first forward's codebook is
    favor.Codebook.kmeans's with that seed, bit for bit, and a training step runs."""
    seed = 2**64 - 5
    torch.manual_seed(0)
    m = ft.VQAttention(16, 2, 4, seed=seed, dead_after=1).eval()
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        m(x)
        k = m._heads(m.k_proj(x))
    want = favor.Codebook.kmeans(np.ascontiguousarray(k.numpy()), 4,
                                 iterations=m.kmeans_iterations, seed=seed)
    assert torch.equal(m.codebook, torch.from_numpy(np.asarray(want.values)))
    m.train()
    m(x).sum().backward()
    assert int(m.updates) == 1
