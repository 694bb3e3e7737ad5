"""Learned feature maps in favor.torch: the autograd function's gradients for W, b, lambda
and the decay gamma against torch autograd through the plain float64 formula
(favor.torch.plain), the modules' map parameters (FavorAttention, MultiheadAttention,
convert), their decoder and state_dict, favor.fit_features, and the errors.

Tolerance: feature_map_helpers (2x the naive float32 error + 1e-6). Seeds are fixed.
Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_feature_map_torch.py
"""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import favor
import favor.torch as ft
from favor.fit import clustered_qkv
from favor.torch import plain
from feature_map_helpers import assert_twice_naive, learned_map, qkv, tensors

B, H, N, D, DV, M = 2, 3, 11, 6, 5, 8


def _grads(fn, inputs, dy):
    ts = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y = fn(*ts)
    (y * dy.to(y.dtype)).sum().backward()
    return y.detach(), [None if t is None else t.grad for t in ts]


def _compare(kernel, causal, sets, learn, decay=None, seed=0):
    """favor.torch.attention with tensors W [sets, m, D], b, lambda, gamma against autograd
    through plain.attention_materialised in float64 (and float32 for the naive error)."""
    q, k, v = qkv(B, H, N, D, DV, seed=seed)
    fm = learned_map(kernel, M, D, sets, seed=seed + 1)
    w, b, lam = tensors(fm)
    g = None if decay is None else torch.tensor(decay, dtype=torch.float64).float().double()
    dy = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(seed + 2),
                     dtype=torch.float64).float().double()

    def plain_fn(q, k, v, w, b, lam, g):
        return plain.attention_materialised(q, k, v, w, kernel=kernel, causal=causal, bias=b,
                                            lam=lam, decay=g)

    def favor_fn(q, k, v, w, b, lam, g):
        return ft.attention(q.float(), k.float(), v.float(), kernel=kernel, causal=causal,
                            weights=w, bias=b, feature_weights=lam, decay=g)

    inputs = (q, k, v, w, b, lam, g)
    ref_y, ref_g = _grads(plain_fn, inputs, dy)
    naive_y, naive_g = _grads(plain_fn, [None if t is None else t.float() for t in inputs], dy)
    y, got = _grads(favor_fn, inputs, dy)
    assert y.dtype == torch.float32
    assert_twice_naive(y, ref_y, naive_y, "y")
    names = ("dq", "dk", "dv", "dW", "db", "dlambda", "dgamma")
    for i, name in enumerate(names):
        if name in learn:
            assert got[i] is not None and got[i].shape == inputs[i].shape, name
            assert got[i].dtype == torch.float64, name  # the parameter's dtype
            assert_twice_naive(got[i], ref_g[i], naive_g[i], f"{kernel} {name}")


# trig is compared causal only: bidirectionally, with m = 8 features, some trig denominators
# of these inputs come close to 0 (the plain formula in float32 is then 5e8 x |dy| away from
# float64), and such an ill-conditioned instance tests nothing.
@pytest.mark.parametrize("kernel, causal", [
    ("positive", False), ("positive", True), ("hyperbolic", False), ("hyperbolic", True),
    ("hedgehog", False), ("hedgehog", True), ("trig", True)])
def test_weight_and_bias_gradients_match_plain_float64(kernel, causal):
    _compare(kernel, causal, H, ("dq", "dk", "dv", "dW", "db"), seed=3)


@pytest.mark.parametrize("sets", [1, B * H])
def test_parameter_sets_shared_or_per_batch_and_head(sets):
    _compare("hedgehog", True, sets, ("dq", "dk", "dv", "dW", "db"), seed=5)


@pytest.mark.parametrize("kernel", ["positive", "hedgehog"])
@pytest.mark.parametrize("causal", [False, True])
def test_lambda_gradient_matches_plain_float64(kernel, causal):
    """Needs the C++ kernels to fill the lambda gradient (dL/d log lambda^2)."""
    _compare(kernel, causal, H, ("dlambda",), seed=7)


@pytest.mark.parametrize("decay", [[0.9], [0.95, 0.7, 0.85]])
def test_decay_gradient_matches_plain_float64(decay):
    """Needs the C++ kernels to fill the decay gradient (dL/d rate, rate = -log gamma)."""
    _compare("hedgehog", True, H, ("dq", "dk", "dv", "dgamma"), decay=decay, seed=9)


def test_decay_values_without_gradient_and_the_shared_projection_tensor():
    """A float decay is a constant; a projection tensor [m, D] with lambda is the shared W
    (dW [m, D]), as learn_projection trains it."""
    q, k, v = (t.float() for t in qkv(seed=11))
    fm = learned_map("positive", M, D, H, seed=12, weights=False, bias=False)
    w = torch.from_numpy(fm.projection.copy()).requires_grad_()
    y = ft.attention(q, k, v, projection=w, feature_weights=torch.from_numpy(fm.lambda_),
                     causal=True, decay=0.9)
    y.sum().backward()
    assert w.grad.shape == (M, D)
    ref = favor.attention(q.numpy(), k.numpy(), v.numpy(), feature_map=fm, causal=True, decay=0.9)
    assert torch.equal(y, torch.from_numpy(ref))
    # a favor.FeatureMap: its arrays are constants
    assert torch.equal(ft.attention(q, k, v, feature_map=fm, causal=True, decay=[0.9]), y)


# -- modules ------------------------------------------------------------------------------


def _module(**kw):
    torch.manual_seed(0)
    opts = dict(causal=True, kernel="hedgehog", features=M, learn_features=True,
                feature_weights=True, decay=[0.9, 0.8], learn_decay=True)
    opts.update(kw)
    return ft.FavorAttention(16, 2, **opts)


def test_favor_attention_holds_the_map_as_parameters():
    mod = _module()
    shapes = {n: tuple(p.shape) for n, p in mod.named_parameters() if not n.endswith("proj.weight")
              and not n.endswith("proj.bias")}
    assert shapes == {"core.map_weight": (2, M, 8), "core.map_bias": (2, M),
                      "core.map_lambda": (2, M), "core.decay_logit": (2,)}
    assert all(torch.equal(w, mod.projection) for w in mod.map_weight)
    assert torch.equal(mod.map_bias, torch.zeros(2, M))
    assert torch.equal(mod.map_lambda, torch.ones(2, M))
    torch.testing.assert_close(mod.gamma, torch.tensor([0.9, 0.8]), rtol=0, atol=1e-7)
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(1))
    y = mod(x)
    y.square().sum().backward()
    for name in ("map_weight", "map_bias"):
        assert getattr(mod, name).grad.abs().sum() > 0, name
    # the module equals the function with its parameters
    q, k, v = (mod._heads(p(x)) for p in (mod.q_proj, mod.k_proj, mod.v_proj))
    core = ft.attention(q, k, v, causal=True, kernel="hedgehog", projection=mod.projection,
                        weights=mod.map_weight, bias=mod.map_bias, feature_weights=mod.map_lambda,
                        decay=torch.sigmoid(mod.decay_logit))
    assert torch.equal(y, mod.out_proj(mod._merge(core)))


def test_learned_map_and_decay_parameters_receive_gradients():
    """Needs the C++ lambda and decay gradients: every map parameter trains."""
    mod = _module()
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(2))
    mod(x).square().sum().backward()
    for name in ("map_lambda", "decay_logit"):
        assert getattr(mod, name).grad.abs().sum() > 0, name


@pytest.mark.parametrize("learn_decay", [False, True])
def test_decoder_carries_the_map_and_the_decay(learn_decay):
    mod = _module(learn_decay=learn_decay)
    with torch.no_grad():
        mod.map_bias.normal_(0, 0.1, generator=torch.Generator().manual_seed(3))
        mod.map_lambda.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        y = mod(x)
        dec = mod.decoder(2)
        rows = [mod.step(x[:, :3], dec)] + [mod.step(x[:, i:i + 1], dec) for i in range(3, 10)]
    # the same float32 formula summed in another order: a few ulps of |y| (measured 1.2e-7)
    torch.testing.assert_close(torch.cat(rows, 1), y, rtol=0, atol=1e-6)
    fm = mod.feature_map()
    assert fm.kernel == "hedgehog" and fm.heads == 2 and fm.weights.shape == (2, M, 8)


def test_state_dict_round_trip():
    mod = _module()
    with torch.no_grad():
        mod.map_weight.add_(0.1)
        mod.map_bias.add_(0.2)
        mod.map_lambda.mul_(1.5)
        mod.decay_logit.sub_(0.3)
    other = _module(decay=[0.5, 0.5])
    other.load_state_dict(mod.state_dict())
    x = torch.randn(2, 10, 16, generator=torch.Generator().manual_seed(6))
    assert torch.equal(other(x), mod(x))
    assert set(mod.state_dict()) >= {"core.map_weight", "core.map_bias", "core.map_lambda",
                                     "core.decay_logit", "core.projection"}


def test_learned_decay_stays_in_the_unit_interval():
    """gamma = sigmoid(decay_logit): whatever the optimiser does to the logit."""
    mod = _module()
    with torch.no_grad():
        mod.decay_logit.copy_(torch.tensor([60.0, -60.0]))
    g = mod.gamma
    assert bool((g > 0).all()) and bool((g <= 1).all())
    start = _module(decay=1.0)
    assert 1 - 2e-6 < float(start.gamma) < 1  # gamma = 1 starts at 1 - 1e-6


def test_multihead_attention_and_convert_train_the_map():
    """A small encoder converted to hedgehog attention with learned maps: the map
    parameters are trainable parameters of the model, the loss falls in a few Adam steps,
    and the state_dict round trips."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2)
    replaced = ft.convert(model, kernel="hedgehog", features=M, feature_weights=True)
    assert len(replaced) == 2
    names = [n for n, _ in model.named_parameters()]
    for i in range(2):
        for p in ("map_weight", "map_bias", "map_lambda"):
            assert f"layers.{i}.self_attn.core.{p}" in names
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 12, 16, generator=g)
    target = torch.randn(8, 12, 16, generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = (model(x) - target).square().mean()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.9 * losses[0], losses
    attn = model.layers[0].self_attn
    assert not torch.equal(attn.map_weight[0], attn.projection)  # the map moved
    again = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, dim_feedforward=32,
                                                             dropout=0.0, batch_first=True), 2)
    ft.convert(again, kernel="hedgehog", features=M, feature_weights=True)
    again.load_state_dict(model.state_dict())
    model.eval()
    again.eval()
    assert torch.equal(again(x), model(x))


def test_convert_with_a_fitted_map_as_init():
    fm = learned_map("hedgehog", M, 8, 2, seed=13, lambda_=False)
    model = nn.Sequential(nn.MultiheadAttention(16, 2, batch_first=True))
    ft.convert(model, init=fm)
    attn = model[0]
    assert attn.kernel == "hedgehog" and attn.features == M and attn.map_lambda is None
    assert torch.equal(attn.map_weight, torch.from_numpy(fm.weights))
    assert torch.equal(attn.map_bias, torch.from_numpy(fm.bias))
    assert torch.equal(attn.projection, torch.from_numpy(fm.projection))
    x = torch.randn(2, 5, 16)
    out, _ = attn(x, x, x, need_weights=False)
    assert out.shape == (2, 5, 16)


def _mha_with_decay(decay, **kw):
    """A favor MultiheadAttention (positive, m = M) with torch's initial weights for seed 0."""
    torch.manual_seed(0)
    return ft.MultiheadAttention(16, 2, batch_first=True, features=M, decay=decay, **kw)


def test_multihead_attention_decay_applies_to_causal_calls_only():
    """decay is gamma^(i - j) on causal attention: a call without a causal mask (self or
    cross-attention) runs plain FAVOR, bit for bit the module without decay; a causal call is
    favor.torch.attention with the decay."""
    with_decay, without = _mha_with_decay(0.9), _mha_with_decay(None)
    without.load_state_dict(with_decay.state_dict())
    g = torch.Generator().manual_seed(20)
    x, memory = torch.randn(2, 7, 16, generator=g), torch.randn(2, 5, 16, generator=g)
    for key in (x, memory):
        got, _ = with_decay(x, key, key, need_weights=False)
        want, _ = without(x, key, key, need_weights=False)
        assert torch.equal(got, want)
    mask = nn.Transformer.generate_square_subsequent_mask(7)
    got, _ = with_decay(x, x, x, need_weights=False, attn_mask=mask, is_causal=True)
    q, k, v = (t.view(2, 7, 2, 8).transpose(1, 2) for t in with_decay._in_projection(x, x, x))
    core = ft.attention(q, k, v, causal=True, features=M, projection=with_decay.projection,
                        decay=0.9)
    assert torch.equal(got, with_decay.out_proj(core.transpose(1, 2).reshape(2, 7, 16)))
    plain_causal, _ = without(x, x, x, need_weights=False, attn_mask=mask, is_causal=True)
    assert not torch.equal(got, plain_causal)
    # a learned decay trains through the causal calls only
    learned = _mha_with_decay([0.9, 0.8], learn_decay=True)
    learned(x, memory, memory, need_weights=False)[0].sum().backward()
    assert learned.decay_logit.grad is None
    learned(x, x, x, need_weights=False, is_causal=True, attn_mask=mask)[0].sum().backward()
    assert learned.decay_logit.grad.abs().sum() > 0


def test_convert_with_decay_runs_a_decoder_layer():
    """convert(decay=...) on a decoder layer: the causal self-attention decays, the
    cross-attention (non-causal) runs without decay; the first forward used to raise."""
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    plain_layer = copy.deepcopy(layer)
    ft.convert(layer, features=M, decay=0.95)
    ft.convert(plain_layer, features=M)
    g = torch.Generator().manual_seed(21)
    tgt, memory = torch.randn(2, 7, 16, generator=g), torch.randn(2, 5, 16, generator=g)
    mask = nn.Transformer.generate_square_subsequent_mask(7)
    # torch 2.x's causal hint: favor does not read (or recognise) the L x L mask
    y = layer(tgt, memory, tgt_mask=mask, tgt_is_causal=True)
    assert y.shape == (2, 7, 16) and bool(torch.isfinite(y).all())
    assert not torch.equal(y, plain_layer(tgt, memory, tgt_mask=mask, tgt_is_causal=True))
    with pytest.raises(ValueError, match="attn_mask: a mask of shape \\[7, 7\\] without "
                                         "is_causal=True"):
        layer(tgt, memory, tgt_mask=mask)
    # the decoder stack detects the causal mask itself and passes the hint
    stack = nn.TransformerDecoder(layer, 1)
    assert torch.equal(stack(tgt, memory, tgt_mask=mask),
                       stack(tgt, memory, tgt_mask=mask, tgt_is_causal=True))
    # the cross-attention module alone: no decay on its (non-causal) call
    x = torch.randn(2, 7, 16, generator=g)
    got, _ = layer.multihead_attn(x, memory, memory, need_weights=False)
    want, _ = plain_layer.multihead_attn(x, memory, memory, need_weights=False)
    assert torch.equal(got, want)


@pytest.mark.parametrize("kw", [dict(decay=0.9), dict(decay=[0.9, 0.8], learn_decay=True)])
def test_favor_attention_refuses_decay_without_causal(kw):
    """FavorAttention's causal flag is fixed: a decay on a non-causal module would raise at
    every forward, so it is refused at construction, naming decay."""
    with pytest.raises(ValueError, match="^decay: .*causal"):
        ft.FavorAttention(16, 2, features=M, **kw)
    ft.FavorAttention(16, 2, features=M, causal=True, **kw)  # causal: fine


# -- fit_features -------------------------------------------------------------------------


@pytest.mark.parametrize("objective", ["output", "kl"])
def test_fit_features_lowers_the_heldout_error(objective):
    """On structured data (keys and queries around shared cluster centres per head) the
    fitted hedgehog map's held-out error falls well below the start's, and on average
    over the steps (the last third below the first third)."""
    q, k, v = clustered_qkv(6, 2, 64, 8, seed=0)
    fm, hist = favor.fit_features(q, k, v, kernel="hedgehog", features=16, steps=60, lr=0.02,
                                  objective=objective, holdout=1 / 3, seed=0, kl_block=24)
    assert [h["step"] for h in hist] == list(range(61))
    assert set(hist[0]) == {"step", "loss", "heldout_error", "seconds"}
    errors = [h["heldout_error"] for h in hist]
    assert errors[-1] < 0.75 * errors[0], errors
    assert np.mean(errors[-20:]) < np.mean(errors[:20])
    losses = [h["loss"] for h in hist]
    assert losses[-1] < losses[0]
    seconds = [h["seconds"] for h in hist]
    assert all(a <= b for a, b in zip(seconds, seconds[1:]))
    assert fm.kernel == "hedgehog" and fm.heads == 2 and fm.weights.shape == (2, 16, 8)
    assert fm.bias.shape == (2, 16) and fm.lambda_.shape == (2, 16)
    # the returned map is the fitted one: its held-out error is the last one recorded
    hq, hk, hv = (x[4:] for x in (q, k, v))
    y = favor.attention(hq, hk, hv, feature_map=fm)
    exact = favor.exact_attention(hq, hk, hv)
    err = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert abs(err - errors[-1]) < 1e-5


@pytest.mark.parametrize("kernel, causal", [("hedgehog", False), ("hedgehog", True),
                                            ("positive", True), ("hyperbolic", False)])
def test_blockwise_kl_objective_equals_the_materialised_kl(kernel, causal):
    """fit_features' KL objective (blocks of 4 query rows over N = 11, phi(K) formed once,
    its gradient accumulated over the blocks) against the materialised row-wise
    KL(softmax || linear), value and gradients of W, b, lambda, by the 2x-naive rule."""
    from favor.fit import _kl_step, _Parameters

    q, k, _ = qkv(seed=15)
    fm = learned_map(kernel, M, D, H, seed=16)
    params = _Parameters(fm.kernel, fm.resolved_scale, fm.projection, fm.weights, fm.bias,
                         fm.lambda_, ("weights", "bias", "lambda"))
    loss = _kl_step(params, q.float(), k.float(), causal, 4)
    got = [t.grad for t in params.learned]

    def materialised(dtype):
        w, b, lam = (t.detach().to(dtype).clone().requires_grad_() for t in params.learned)
        a = (plain.feature_map(q.to(dtype), w, kernel, fm.scale, None, b, lam)
             @ plain.feature_map(k.to(dtype), w, kernel, fm.scale, None, b, lam).transpose(-1, -2))
        s = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * params.scale
        if causal:
            a = torch.tril(a)
            s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        log_p = torch.log_softmax(s, -1)
        log_q = torch.log(a) - torch.log(a.sum(-1, keepdim=True))
        terms = torch.exp(log_p) * (log_p - log_q)
        kl = torch.where(torch.isfinite(log_p), terms, torch.zeros_like(terms)).sum() / (B * H * N)
        kl.backward()
        return kl.detach(), [w.grad, b.grad, lam.grad]

    ref_loss, ref = materialised(torch.float64)
    naive_loss, naive = materialised(torch.float32)
    assert_twice_naive(torch.tensor([loss]), ref_loss.reshape(1), naive_loss.reshape(1), "KL")
    for name, g, r, n in zip(("dW", "db", "dlambda"), got, ref, naive):
        assert_twice_naive(g, r, n, name)


def test_fit_features_causal_with_heldout_and_verbose(capsys):
    q, k, v = clustered_qkv(2, 1, 48, 8, seed=1)
    hq, hk, hv = clustered_qkv(1, 1, 48, 8, seed=2)
    fm, hist = favor.fit_features(q[0, 0], k[0, 0], v[0, 0], kernel="positive", features=8,
                                  steps=10, lr=0.02, causal=True, heldout=(hq, hk, hv),
                                  learn=("weights", "bias"), seed=3, verbose=True, eval_every=5)
    out = capsys.readouterr().out
    assert "seed=3" in out and "kernel=positive" in out and out.count("heldout_error") == 3
    assert [h["step"] for h in hist] == [0, 5, 10]
    assert fm.lambda_ is None and fm.weights.shape == (1, 8, 8) and fm.heads == 1
    # the map carries the projection drawn with the seed
    assert np.array_equal(fm.projection, favor.Projection.draw(8, 8, seed=3).matrix)


@pytest.mark.parametrize("kw, match", [
    (dict(kernel="favorpp"), "kernel"),
    (dict(objective="mse"), "objective"),
    (dict(kernel="trig", objective="kl"), "objective"),
    (dict(learn=("weights", "gamma")), "learn"),
    (dict(learn=()), "learn"),
    (dict(holdout=1.5), "holdout"),
    (dict(steps=-1), "steps"),
    (dict(features=0), "features"),
    (dict(lr=0), "lr"),
    (dict(kl_block=0), "kl_block"),
    (dict(heldout=(1, 2)), "heldout"),
    (dict(start="map.npz"), "start"),
    (dict(lambda_floor=0.0), "lambda_floor"),
    (dict(lambda_floor=float("nan")), "lambda_floor"),
])
def test_fit_features_bad_arguments_raise_value_errors(kw, match):
    q, k, v = clustered_qkv(2, 1, 16, 4, seed=4)
    with pytest.raises(ValueError, match=match):
        favor.fit_features(q, k, v, **{"steps": 1, **kw})


def test_fit_features_keeps_the_start_maps_parameter_sets():
    """As the C++ fit: a start with shared parameter sets (heads = 1) stays shared (the
    parameters it lacks are made shared too), one with H sets keeps them, and a start
    without learned parameters gets one set per head."""
    q, k, v = clustered_qkv(3, 2, 16, 4, seed=22)
    shared = favor.FeatureMap.hedgehog(M, 4, heads=1, seed=1)
    for objective in ("output", "kl"):
        fm, _ = favor.fit_features(q, k, v, start=shared, steps=2, holdout=1 / 3,
                                   objective=objective)
        assert fm.heads == 1 and fm.weights.shape == (1, M, 4), objective
        assert fm.bias.shape == (1, M) and fm.lambda_.shape == (1, M), objective
        assert not np.array_equal(fm.weights, shared.weights), objective  # it was fitted
    per_head = favor.FeatureMap.hedgehog(M, 4, heads=2, seed=1)
    fm, _ = favor.fit_features(q, k, v, start=per_head, steps=2, holdout=1 / 3)
    assert fm.heads == 2 and fm.weights.shape == (2, M, 4)
    # the start is not changed by the fit (its arrays are copied)
    assert np.array_equal(per_head.weights, np.repeat(per_head.projection[None], 2, axis=0))
    assert not per_head.bias.any() and not np.array_equal(fm.bias, per_head.bias)
    bare = favor.FeatureMap(shared.projection, kernel="hedgehog")
    fm, _ = favor.fit_features(q, k, v, start=bare, steps=2, holdout=1 / 3)
    assert fm.heads == 2 and fm.weights.shape == (2, M, 4)


def test_fit_features_keeps_lambda_above_the_floor():
    """After every step |lambda| is raised to at least lambda_floor, its sign kept (the C++
    FitOptions::lambda_floor): with lr = 1e-6 one step moves lambda by at most 1e-6, so the
    weights below the floor land on it and the others stay where they were."""
    q, k, v = clustered_qkv(3, 2, 16, 4, seed=23)
    start = favor.FeatureMap.positive(M, 4, heads=2, seed=1)
    start.lambda_[0, :3] = [1e-5, -1e-5, -0.5]
    start.lambda_[1, 0] = 2e-4
    for floor in (None, 0.6):
        kw = {} if floor is None else dict(lambda_floor=floor)
        fm, _ = favor.fit_features(q, k, v, kernel="positive", start=start, learn="lambda",
                                   steps=1, lr=1e-6, holdout=1 / 3, **kw)
        f = np.float32(1e-3 if floor is None else floor)
        low = np.abs(start.lambda_) < f
        assert np.array_equal(fm.lambda_[low], np.copysign(f, start.lambda_[low]))
        assert np.abs(fm.lambda_[~low] - start.lambda_[~low]).max() <= 2e-6
        assert low.sum() == (3 if floor is None else 4)
    fm, _ = favor.fit_features(q, k, v, kernel="positive", start=start, learn="lambda",
                               steps=0, holdout=1 / 3)
    assert np.array_equal(fm.lambda_, start.lambda_)  # applied after a step only


@pytest.mark.parametrize("name, value", [
    ("kernel", "trig"), ("scale", 0.5), ("features", M), ("projection", "iid"),
    ("projection", favor.Projection.draw(M, D, seed=1)), ("projection", torch.ones(M, D)),
    ("fit", -0.1), ("norms", "fixed"), ("seed", 3)])
def test_attention_with_a_feature_map_refuses_the_options_it_carries(name, value):
    """As favor.attention: the map carries the kernel, projection, scale and fit, so the
    drawing options must keep their defaults (they were ignored)."""
    q, k, v = (t.float() for t in qkv(seed=24))
    fm = learned_map("hedgehog", M, D, H, seed=25)
    ft.attention(q, k, v, feature_map=fm, kernel="positive", norms="chi", seed=0)  # defaults
    with pytest.raises(ValueError, match=f"^{name}: the feature_map carries"):
        ft.attention(q, k, v, feature_map=fm, **{name: value})


def test_parameter_errors_name_the_callers_argument():
    """The map favor.torch.attention builds from weights, bias and feature_weights is checked
    against the inputs (B = 2, H = 3) naming the argument the caller gave, not the
    internal feature_map."""
    q, k, v = (t.float() for t in qkv(seed=26))
    lam = torch.ones(1, M)
    lam[0, 5] = 0
    cases = [
        (dict(feature_weights=torch.ones(4, M)), "^feature_weights: has 4 parameter sets"),
        (dict(feature_weights=torch.full((1, M), float("nan"))),
         r"^feature_weights\[0\] = nan: feature weights must be finite and nonzero"),
        (dict(feature_weights=lam), r"^feature_weights\[5\] = 0: feature weights"),
        (dict(feature_weights=torch.ones(1, M + 1)), "^feature_weights: .*m = 8"),
        (dict(feature_weights=torch.ones(2, 2, M)), "^feature_weights: shape"),
        (dict(bias=torch.ones(2, M)), "^bias: has 2 parameter sets"),
        (dict(bias=torch.full((H, M), float("inf"))), r"^bias\[0\] = inf: not finite"),
        (dict(weights=torch.ones(H, M, D), bias=torch.zeros(1, M)),
         "^bias: has 1 parameter sets .*weights has 3"),
        (dict(weights=torch.full((1, M, D), float("nan"))), r"^weights\[0\] = nan"),
    ]
    for kw, match in cases:
        kw.setdefault("features", None if "weights" in kw else M)
        with pytest.raises(ValueError, match=match):
            ft.attention(q, k, v, **kw)
    # lambda [m] is one set, as in favor.attention
    lam = 1 + 0.1 * torch.randn(M, generator=torch.Generator().manual_seed(27))
    assert torch.equal(ft.attention(q, k, v, features=M, feature_weights=lam),
                       ft.attention(q, k, v, features=M, feature_weights=lam[None]))


def test_module_and_function_errors():
    q, k, v = (t.float() for t in qkv(seed=14))
    cases = [
        (lambda: ft.FavorAttention(16, 2, kernel="favorpp", learn_features=True), "kernel"),
        (lambda: ft.FavorAttention(16, 2, learn_features=True, learn_projection=True),
         "learn_projection"),
        (lambda: ft.FavorAttention(16, 2, feature_weights=True, feature_redraw_interval=5),
         "feature_redraw_interval"),
        (lambda: ft.FavorAttention(16, 2, learn_decay=True), "learn_decay"),
        (lambda: ft.FavorAttention(16, 2, decay=[0.9, 0.9, 0.9]), "decay"),
        (lambda: ft.FavorAttention(16, 2, decay=1.5), "decay"),
        (lambda: ft.FavorAttention(16, 2, method="exact", learn_features=True), "method"),
        (lambda: ft.FavorAttention(16, 2, learn_features=True, feature_init="identity"),
         "feature_init"),
        (lambda: ft.FavorAttention(16, 2, kernel="hedgehog", features=M, learn_features=True,
                                   feature_init=learned_map("positive", M, 8, 1, seed=1)),
         "feature_init: a positive map"),
        (lambda: ft.FavorAttention(16, 2, kernel="hedgehog", features=M, learn_features=True,
                                   feature_init=learned_map("hedgehog", M, 6, 1, seed=1)),
         "feature_init: the map is 8 x 6"),
        (lambda: _module(causal=False)(torch.randn(1, 4, 16)), "decay"),
        (lambda: ft.attention(q, k, v, weights=torch.ones(H, M, D + 1)), "weights"),
        (lambda: ft.attention(q, k, v, bias=torch.ones(2, M), features=M), "bias"),
        (lambda: ft.attention(q, k, v, feature_weights=torch.zeros(1, M), features=M),
         r"feature_weights\[0\] = 0"),
        (lambda: ft.attention(q, k, v, feature_map=learned_map("hedgehog", M, D, 1, seed=2),
                              bias=torch.zeros(1, M)), "feature_map"),
        (lambda: ft.attention(q, k, v, method="exact", decay=0.9, causal=True), "method"),
        (lambda: ft.attention(q, k, v, causal=True, decay=torch.tensor([1.5])), "decay"),
        (lambda: ft.convert(nn.Sequential(nn.MultiheadAttention(16, 2)), method="vq",
                            init="projection"), "init"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
