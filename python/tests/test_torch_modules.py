"""favor.torch's modules: FavorAttention, the MultiheadAttention drop-in and convert()."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import favor
import favor.torch as ft
from torch_helpers import rel


def _mha_pair(batch_first=True, kdim=None, vdim=None, bias=True, **favor_options):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(16, 4, bias=bias, kdim=kdim, vdim=vdim,
                                batch_first=batch_first).eval()
    ours = ft.MultiheadAttention.from_torch(ref, **favor_options)
    return ref, ours


def _inputs(batch_first, n=10, s=None, kdim=16, vdim=16, batch=3):
    g = torch.Generator().manual_seed(1)
    s = n if s is None else s
    shape = (lambda l, e: (batch, l, e)) if batch_first else (lambda l, e: (l, batch, e))
    return (torch.randn(*shape(n, 16), generator=g), torch.randn(*shape(s, kdim), generator=g),
            torch.randn(*shape(s, vdim), generator=g))


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("dims", [(None, None), (12, 20)])
def test_drop_in_exact_equals_torch_multihead_attention(batch_first, dims):
    kdim, vdim = dims
    ref, ours = _mha_pair(batch_first, kdim, vdim, method="exact")
    q, k, v = _inputs(batch_first, s=7, kdim=kdim or 16, vdim=vdim or 16)
    ignore = torch.zeros(3, 7, dtype=torch.bool)
    ignore[1, 4:] = True
    with torch.no_grad():
        want, _ = ref(q, k, v, key_padding_mask=ignore, need_weights=False)
        got, weights = ours(q, k, v, key_padding_mask=ignore, need_weights=False)
    assert weights is None
    assert got.shape == want.shape
    assert rel(got, want) < 1e-5  # float32 throughout; only the summation order differs


def test_drop_in_self_attention_unbatched_and_causal_masks():
    ref, ours = _mha_pair(batch_first=False, method="exact")
    x = torch.randn(9, 16)
    with torch.no_grad():
        want, _ = ref(x, x, x, need_weights=False)
        got, _ = ours(x, x, x, need_weights=False)
        assert got.shape == (9, 16) and rel(got, want) < 1e-5
        xb = torch.randn(9, 2, 16)
        causal_bool = torch.ones(9, 9, dtype=torch.bool).triu(1)
        causal_float = nn.Transformer.generate_square_subsequent_mask(9)
        want, _ = ref(xb, xb, xb, attn_mask=causal_bool, need_weights=False)
        for mask in (causal_bool, causal_float, causal_float.expand(2 * 4, 9, 9)):
            # torch 2.x's contract: is_causal=True says attn_mask is the causal mask
            got, _ = ours(xb, xb, xb, attn_mask=mask, need_weights=False, is_causal=True)
            assert rel(got, want) < 1e-5
            assert ft.is_causal_mask(mask)
            with pytest.raises(ValueError, match="attn_mask: a mask of shape .* without "
                                                 "is_causal=True"):
                ours(xb, xb, xb, attn_mask=mask, need_weights=False)
        got, _ = ours(xb, xb, xb, is_causal=True, need_weights=False)
        assert rel(got, want) < 1e-5


def test_drop_in_refuses_what_favor_cannot_do():
    _, ours = _mha_pair(batch_first=True)
    x = torch.randn(2, 6, 16)
    with pytest.raises(ValueError, match="need_weights"):
        ours(x, x, x, need_weights=True)
    assert ours(x, x, x)[1] is None  # torch's default need_weights=True reads no weights
    band = torch.ones(6, 6, dtype=torch.bool).triu(2)  # not the causal mask
    with pytest.raises(ValueError, match="attn_mask"):
        ours(x, x, x, attn_mask=band, need_weights=False)
    with pytest.raises(ValueError, match="attn_mask"):
        ours(x, x, x, attn_mask=torch.zeros(6, 6), need_weights=False)  # an all-zero bias is
        # harmless, but favor refuses every non-causal mask rather than guess
    with pytest.raises(ValueError, match="add_bias_kv"):
        ft.MultiheadAttention(16, 4, add_bias_kv=True)
    with pytest.raises(ValueError, match="num_heads"):
        ft.MultiheadAttention(16, 3)
    with pytest.warns(UserWarning, match="dropout"):
        ft.MultiheadAttention(16, 4, dropout=0.1)


def test_errors_name_the_arguments_the_caller_gave():
    """The projection kind and the key mask have other names in C++ and the numpy API
    (Projection.draw's kind, key_mask): the torch functions and modules name them as their
    callers gave them, projection and key_padding_mask, on every path."""
    refused = r"^projection: 'bogus' is not a projection; use iid, orthogonal"
    for make in (lambda: ft.FavorAttention(16, 4, projection="bogus"),
                 lambda: ft.MultiheadAttention(16, 4, projection="bogus"),
                 lambda: ft.FavorCore(4, 4, projection="bogus")):
        with pytest.raises(favor.Error, match=refused):
            make()
    x = torch.randn(2, 6, 16)
    mask = torch.zeros(2, 5, dtype=torch.bool)
    q = torch.randn(2, 4, 6, 4)
    wrong_shape = r"^key_padding_mask: shape \[2,5\] must be"
    for call in (lambda: ft.FavorAttention(16, 4, features=8)(x, key_padding_mask=mask),
                 lambda: ft.MultiheadAttention(16, 4, features=8, batch_first=True)(
                     x, x, x, key_padding_mask=mask),
                 lambda: ft.attention(q, q, q, key_padding_mask=mask, features=8),
                 lambda: ft.attention(q, q, q, key_padding_mask=mask, features=8,
                                      backend="torch"),
                 lambda: ft.attention(q, q, q, key_padding_mask=mask, method="exact"),
                 lambda: ft.vq_attention(q, q, q, torch.randn(3, 4), key_padding_mask=mask)):
        with pytest.raises(favor.Error, match=wrong_shape):
            call()


def test_drop_in_keeps_torch_parameter_names_and_loads_its_state_dict():
    ref = nn.MultiheadAttention(16, 4)
    ours = ft.MultiheadAttention(16, 4, features=32)
    assert set(ref.state_dict()) <= set(ours.state_dict())
    assert set(ours.state_dict()) - set(ref.state_dict()) == {"core.projection"}
    before = ours.projection.clone()
    ours.load_state_dict(ref.state_dict())  # strict: the missing projection is ours to keep
    assert torch.equal(ours.projection, before)
    assert torch.equal(ours.in_proj_weight, ref.in_proj_weight)
    ours2 = ft.MultiheadAttention(16, 4, features=32, seed=9)
    ours2.load_state_dict(ours.state_dict())  # and a favor state_dict restores the projection
    assert torch.equal(ours2.projection, before)


def _encoder(causal=False, batch_first=True, layers=2):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first)
    return nn.TransformerEncoder(layer, layers).eval()


def _count_favor_calls(model):
    calls = []
    for module in model.modules():
        if isinstance(module, ft.MultiheadAttention):
            module.register_forward_hook(lambda *a: calls.append(1))
    return calls


@pytest.mark.parametrize("padding", [False, True])
def test_converted_encoder_runs_favor_in_eval_not_torch_fused_path(padding):
    """nn.TransformerEncoder(Layer) in eval under no_grad takes torch's fused fast path
    (and, with a padding mask, nested tensors), computing softmax attention from
    in_proj_weight without calling self_attn. A converted model must not: each favor
    module is called, and the output differs from the original (FAVOR is an estimate)."""
    model = _encoder()
    x = torch.randn(3, 20, 32)
    ignore = torch.zeros(3, 20, dtype=torch.bool)
    if padding:
        ignore[0, 15:] = True
    kw = dict(src_key_padding_mask=ignore) if padding else {}
    with torch.no_grad():
        original = model(x, **kw)
    replaced = ft.convert(model, features=64)
    assert list(replaced) == ["layers.0.self_attn", "layers.1.self_attn"]
    assert all(type(m) is nn.MultiheadAttention for m in replaced.values())
    calls = _count_favor_calls(model)
    with torch.no_grad():
        converted = model(x, **kw)
    assert len(calls) == 2
    assert not torch.allclose(converted, original)


def test_converted_model_trains_through_favor():
    model = _encoder()
    ft.convert(model, features=32)
    model.train()
    calls = _count_favor_calls(model)
    x = torch.randn(2, 12, 32)
    model(x).pow(2).mean().backward()
    assert len(calls) == 2
    attn = model.layers[0].self_attn
    assert attn.in_proj_weight.grad is not None and attn.in_proj_weight.grad.abs().sum() > 0


@pytest.mark.parametrize("causal", [False, True])
def test_converted_encoder_with_exact_method_equals_the_original(causal):
    model = _encoder()
    x = torch.randn(3, 20, 32)
    mask = nn.Transformer.generate_square_subsequent_mask(20) if causal else None
    with torch.no_grad():
        original = model(x, mask=mask)
        ft.convert(model, method="exact")
        converted = model(x, mask=mask)
    assert rel(converted, original) < 1e-5  # float32; the fused path sums in another order


def test_converted_encoder_error_falls_as_features_grow():
    """Relative output error of a converted encoder against the original, over 16 seeds per
    m. Theory (math.md s.4) gives a relative RMS error ~ 1/sqrt(m) once m is large enough;
    at the N(0,1)-scale inputs that LayerNorm feeds the second layer the estimator is
    heavy-tailed and the fall is slower (the table in docs/python.md), and the spread over
    seeds is ~25% of the mean, so adjacent 4x steps can invert. The test asks for what must
    hold: at every 16x step of m the mean error falls by more than 3 standard errors of the
    difference (standard errors from the sample variances)."""
    model = _encoder()
    x = torch.randn(3, 40, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        original = model(x)
    stats = []
    for m in (16, 256, 4096):
        e = []
        for seed in range(16):
            copy_ = copy.deepcopy(model)
            ft.convert(copy_, features=m, seed=seed)
            with torch.no_grad():
                e.append(rel(copy_(x), original))
        stats.append((np.mean(e), np.var(e, ddof=1) / len(e)))
    for (mean_a, var_a), (mean_b, var_b) in zip(stats, stats[1:]):
        assert mean_a - mean_b > 3 * np.sqrt(var_a + var_b), stats


def test_convert_warns_about_dropout_and_refuses_bad_models():
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    with pytest.warns(UserWarning, match="dropout"):
        ft.convert(nn.TransformerEncoder(layer, 1))
    with pytest.raises(ValueError, match="itself"):
        ft.convert(nn.MultiheadAttention(16, 2))
    assert ft.convert(nn.Linear(3, 3)) == {}


def test_convert_decoder_layers_self_and_cross_attention():
    torch.manual_seed(0)
    model = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0,
                                                             batch_first=True), 1).eval()
    tgt, memory = torch.randn(2, 7, 16), torch.randn(2, 11, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(7)
    with torch.no_grad():
        original = model(tgt, memory, tgt_mask=mask)
        replaced = ft.convert(model, method="exact")
        converted = model(tgt, memory, tgt_mask=mask)
    assert sorted(replaced) == ["layers.0.multihead_attn", "layers.0.self_attn"]
    assert rel(converted, original) < 1e-5


def test_favor_attention_module_shapes_gradients_and_exact_method():
    torch.manual_seed(0)
    fa = ft.FavorAttention(32, 4, causal=True, features=32)
    x = torch.randn(2, 15, 32, requires_grad=True)
    y = fa(x)
    assert y.shape == (2, 15, 32)
    y.sum().backward()
    assert x.grad is not None and fa.q_proj.weight.grad.abs().sum() > 0
    assert fa.projection.grad is None and not fa.projection.requires_grad
    # method='exact' with the same weights equals torch's softmax attention on the heads
    fe = ft.FavorAttention(32, 4, causal=True, features=32, method="exact")
    fe.load_state_dict(fa.state_dict())
    with torch.no_grad():
        q, k, v = (fe._heads(p(x)) for p in (fe.q_proj, fe.k_proj, fe.v_proj))
        want = fe.out_proj(fe._merge(ft.plain.softmax_attention(q, k, v, causal=True)))
        assert rel(fe(x), want) < 1e-5


def test_feature_redraw_policy_is_deterministic_and_can_be_fixed():
    fa = ft.FavorAttention(16, 2, features=8, seed=3, feature_redraw_interval=2)
    x = torch.randn(1, 5, 16)
    seen = []
    for _ in range(5):
        fa(x)
        seen.append(fa.projection.clone())
    # calls 1, 2 use the first draw; call 3 redraws (seed 4); call 5 redraws (seed 5)
    assert torch.equal(seen[0], seen[1]) and not torch.equal(seen[1], seen[2])
    assert torch.equal(seen[2], seen[3]) and not torch.equal(seen[3], seen[4])
    assert torch.equal(seen[4], torch.from_numpy(favor.Projection.draw(8, 8, seed=5).matrix.copy()))
    fa.eval()
    fa(x)
    assert torch.equal(fa.projection, seen[4])  # no redraw in eval
    fa.train()
    fa.fix_projection()
    for _ in range(4):
        fa(x)
    assert torch.equal(fa.projection, seen[4])
    fa.redraw(seed=11)
    assert torch.equal(fa.projection, torch.from_numpy(favor.Projection.draw(8, 8, seed=11).matrix.copy()))


def test_learned_projection_receives_gradients():
    fa = ft.FavorAttention(16, 2, features=8, learn_projection=True)
    assert isinstance(fa.projection, nn.Parameter)
    fa(torch.randn(2, 6, 16)).sum().backward()
    assert fa.projection.grad is not None and fa.projection.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="feature_redraw_interval"):
        ft.FavorAttention(16, 2, learn_projection=True, feature_redraw_interval=10)


def test_modules_refuse_tensors_on_other_devices():
    fa = ft.FavorAttention(16, 2, features=8)
    with pytest.raises(ValueError, match="device 'meta'"):
        fa(torch.randn(1, 4, 16, device="meta"))
    _, ours = _mha_pair()
    with pytest.raises(ValueError, match="device 'meta'"):
        x = torch.randn(1, 4, 16, device="meta")
        ours(x, x, x, need_weights=False)
    with pytest.raises(ValueError, match="dtype torch.int64"):
        fa(torch.ones(1, 4, 16, dtype=torch.int64))


def test_decoder_steps_equal_the_causal_forward_and_state_stays_fixed():
    torch.manual_seed(0)
    fa = ft.FavorAttention(32, 4, causal=True, features=64).eval()
    x = torch.randn(2, 30, 32)
    with torch.no_grad():
        full = fa(x)
        dec = fa.decoder(2)
        size = dec.state_bytes
        outs = [fa.step(x[:, :10], dec)]  # prefill
        outs += [fa.step(x[:, i:i + 1], dec) for i in range(10, 30)]
    assert dec.position == 30 and dec.state_bytes == size
    # float32 both ways; the decoder's per-token order of sums differs from the chunks'
    assert rel(torch.cat(outs, 1), full) < 1e-5
    with pytest.raises(ValueError, match="prefill"):
        fa.step(x[:, :3], dec)


@pytest.mark.parametrize("kernel", ["favorpp", "favorsharp"])
def test_a_fitted_kernel_with_decay_decodes_as_its_causal_forward(kernel):
    # The decoder of a core with a decay carries the map's fit too (a favor# layer converted
    # with a decay could not generate: "a favorsharp decoder needs a fit").
    torch.manual_seed(0)
    calibration = 0.3 * np.random.default_rng(0).standard_normal((1, 4, 64, 8), np.float32)
    fit = favor.fit_kernel(kernel, calibration, calibration)  # one per head
    fa = ft.FavorAttention(32, 4, causal=True, features=64, kernel=kernel, fit=fit,
                           decay=0.97).eval()
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        full = fa(x)
        dec = fa.decoder(2)
        outs = [fa.step(x[:, :8], dec)] + [fa.step(x[:, i:i + 1], dec) for i in range(8, 20)]
    assert rel(torch.cat(outs, 1), full) < 1e-5


def test_a_feature_map_with_a_per_head_fit_serves_every_batch_in_numpy():
    # favor.FeatureMap's fit, fitted per head on [1, H, N, D], is repeated over the batch as
    # fit= is: attention and the Decoder agree with the same fit tiled by hand.
    rng = np.random.default_rng(0)
    calibration = 0.3 * rng.standard_normal((1, 4, 64, 8), np.float32)
    fit = favor.fit_kernel("favorsharp", calibration, calibration)
    w = favor.Projection.draw(16, 8, seed=0).matrix
    fm = favor.FeatureMap(w, kernel="favorsharp", fit=fit)
    tiled = favor.FeatureMap(w, kernel="favorsharp", fit=favor.KernelFit(
        np.tile(np.asarray(fit.a), (2, 1)), np.tile(np.asarray(fit.basis), (2, 1, 1))))
    q, k, v = (0.3 * rng.standard_normal((2, 4, 20, 8), np.float32) for _ in range(3))
    y = favor.attention(q, k, v, feature_map=fm, causal=True)
    assert np.array_equal(y, favor.attention(q, k, v, feature_map=tiled, causal=True))
    dec = favor.Decoder(2, 4, 8, feature_map=fm)
    dec.append(k, v)
    # float32 both ways; the decoder sums token by token
    assert np.abs(dec.query(q[:, :, -1:]) - y[:, :, -1:]).max() < 1e-5
