"""favor.FeatureMap and the numpy API with learned feature maps: attention (per-head W, b,
lambda; hedgehog; causal decay), its backward, features(), the Decoder, the .npz map format
(save / load, the members exactly as the C++ library and the CLI read them), and the errors.

The oracle is favor.torch.plain.attention_materialised in float64 with the tolerance rule of
feature_map_helpers (2x the naive float32 error + 1e-6). Seeds are fixed.
Run: cd python/tests && PYTHONPATH=<build>/python python3 -m pytest -q test_feature_maps.py
"""
import math

import numpy as np
import pytest
import torch

import favor
from favor.torch import plain
from feature_map_helpers import (LEARNED_KERNELS, assert_twice_naive, learned_map,
                                 plain_attention, qkv, tensors)

B, H, N, D, DV, M = 2, 3, 11, 6, 5, 8


def _np(t):
    return t.float().numpy()


# -- attention against the plain formula ----------------------------------------------------


@pytest.mark.parametrize("kernel", LEARNED_KERNELS)
@pytest.mark.parametrize("sets", [1, H, B * H])
@pytest.mark.parametrize("causal", [False, True])
def test_map_attention_matches_plain_float64(kernel, sets, causal):
    q, k, v = qkv(B, H, N, D, DV, seed=1)
    fm = learned_map(kernel, M, D, sets, seed=2)
    y = favor.attention(_np(q), _np(k), _np(v), feature_map=fm, causal=causal)
    ref = plain_attention(q, k, v, fm, causal=causal)
    naive = plain_attention(q, k, v, fm, causal=causal, dtype=torch.float32)
    assert y.shape == (B, H, N, DV) and y.dtype == np.float32
    assert_twice_naive(y, ref, naive, f"{kernel} sets={sets} causal={causal}")


@pytest.mark.parametrize("kernel", ["positive", "hedgehog"])
@pytest.mark.parametrize("decay", [0.9, [0.95, 0.8, 0.6]])
def test_causal_decay_matches_plain_float64(kernel, decay):
    """Pair (i, j) weighted by gamma^(i - j), one gamma or one per head; N spans several
    of favor's causal chunks so that the inter-chunk gamma^C rescale is exercised."""
    n = 2 * favor.kernel_info()["causal_chunk"] + 5
    q, k, v = qkv(B, H, n, D, DV, seed=3, scale=0.5)
    fm = learned_map(kernel, M, D, H, seed=4)
    y = favor.attention(_np(q), _np(k), _np(v), feature_map=fm, causal=True, decay=decay)
    ref = plain_attention(q, k, v, fm, causal=True, decay=decay)
    naive = plain_attention(q, k, v, fm, causal=True, decay=decay, dtype=torch.float32)
    assert_twice_naive(y, ref, naive, f"{kernel} decay={decay}")
    # the decay matters: without it the output differs by far more than rounding
    plain_y = favor.attention(_np(q), _np(k), _np(v), feature_map=fm, causal=True)
    assert np.abs(plain_y - y).max() > 1e-2


def test_decay_of_one_is_plain_causal_attention_bit_for_bit():
    q, k, v = (_np(t) for t in qkv(seed=5))
    fm = learned_map("hedgehog", M, D, H, seed=6)
    a = favor.attention(q, k, v, feature_map=fm, causal=True)
    assert np.array_equal(a, favor.attention(q, k, v, feature_map=fm, causal=True, decay=1.0))
    assert np.array_equal(a, favor.attention(q, k, v, feature_map=fm, causal=True,
                                             decay=[1.0, 1.0, 1.0]))
    # and a decay on the drawn projection (no map) is the same kernel path
    b = favor.attention(q, k, v, causal=True, features=M, seed=3)
    assert np.array_equal(b, favor.attention(q, k, v, causal=True, features=M, seed=3, decay=1.0))


def test_key_mask_with_a_learned_map():
    q, k, v = qkv(seed=7)
    fm = learned_map("hedgehog", M, D, H, seed=8)
    keep = np.ones((B, N), bool)
    keep[0, 7:] = False
    keep[1, ::3] = False
    y = favor.attention(_np(q), _np(k), _np(v), feature_map=fm, key_mask=keep)
    ref = plain_attention(q, k, v, fm, keep=keep)
    naive = plain_attention(q, k, v, fm, keep=keep, dtype=torch.float32)
    assert_twice_naive(y, ref, naive, "masked hedgehog")


def test_feature_weights_alone_are_lambda_on_the_drawn_projection():
    """feature_weights=lambda (an array or a .npy path) equals the FeatureMap with that
    lambda on the projection favor.attention draws, bit for bit."""
    q, k, v = (_np(t) for t in qkv(seed=9))
    lam = (1 + 0.3 * np.random.default_rng(1).standard_normal((H, M))).astype(np.float32)
    w = favor.make_projection(D, "orthogonal", features=M, seed=4)
    fm = favor.FeatureMap(w, lambda_=lam)
    y = favor.attention(q, k, v, feature_map=fm)
    assert np.array_equal(y, favor.attention(q, k, v, features=M, seed=4, feature_weights=lam))
    assert not np.array_equal(y, favor.attention(q, k, v, features=M, seed=4))
    # m comes from lambda when features is not given
    assert np.array_equal(y, favor.attention(q, k, v, seed=4, feature_weights=lam))


def test_hedgehog_and_positive_starting_points():
    h = favor.FeatureMap.hedgehog(M, D, heads=H, seed=3)
    w = favor.Projection.draw(M, D, seed=3).matrix
    assert h.kernel == "hedgehog" and h.heads == H and h.features == 2 * M
    assert h.weights.shape == (H, M, D) and all(np.array_equal(x, w) for x in h.weights)
    assert np.array_equal(h.bias, np.zeros((H, M), np.float32)) and h.lambda_ is None
    p = favor.FeatureMap.positive(M, D, heads=H, seed=3)
    assert p.kernel == "positive" and p.weights is None and p.bias is None
    assert np.array_equal(p.lambda_, np.ones((H, M), np.float32))
    # the positive start is FAVOR+ itself: lambda = 1 changes nothing but the path
    q, k, v = (_np(t) for t in qkv(seed=10))
    ref = favor.attention(q, k, v, features=M, seed=3)
    np.testing.assert_allclose(favor.attention(q, k, v, feature_map=p), ref, rtol=0, atol=1e-6)


def test_features_with_a_map_match_plain_float64():
    q, _, _ = qkv(seed=11)
    for kernel in LEARNED_KERNELS:
        fm = learned_map(kernel, M, D, H, seed=12, spread=0.1)
        phi = favor.features(_np(q), feature_map=fm)
        assert phi.shape == (B, H, N, fm.features)
        w, b, lam = tensors(fm)
        ref = plain.feature_map(q, w, kernel, fm.scale, None, b, lam)
        naive = plain.feature_map(q.float(), w.float(), kernel, fm.scale, None, b.float(),
                                  lam.float())
        assert_twice_naive(phi, ref, naive, kernel)


# -- backward -----------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_backward_with_parameter_grads_matches_plain_autograd(causal):
    """dq, dk, dv, dW [H, m, D] and db [H, m] against float64 autograd of the plain formula.
    (dlambda and ddecay: test_lambda_and_decay_gradients_match_plain_autograd.)"""
    q, k, v = qkv(seed=13)
    fm = learned_map("hedgehog", M, D, H, seed=14)
    dy = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(15),
                     dtype=torch.float64).float().double()

    def autograd(dtype):
        w, b, lam = tensors(fm, dtype)
        ts = [t.detach().to(dtype).clone().requires_grad_() for t in (q, k, v, w, b)]
        y = plain.attention_materialised(*ts[:4], kernel="hedgehog", causal=causal, bias=ts[4],
                                         lam=lam)
        (y * dy.to(dtype)).sum().backward()
        return [t.grad for t in ts]

    g = favor.attention_backward(_np(q), _np(k), _np(v), _np(dy), feature_map=fm, causal=causal,
                                 parameter_grads=True)
    assert isinstance(g, favor.FeatureMapGrads)
    assert g.dw.shape == (H, M, D) and g.dbias.shape == (H, M) and g.dlambda.shape == (H, M)
    assert g.ddecay is None
    names = ("dq", "dk", "dv", "dw", "dbias")
    for name, got, ref, naive in zip(names, g[:5], autograd(torch.float64),
                                     autograd(torch.float32)):
        assert_twice_naive(got, ref, naive, name)
    # without parameter_grads: Grads, the same dq, dk, dv
    g2 = favor.attention_backward(_np(q), _np(k), _np(v), _np(dy), feature_map=fm, causal=causal)
    assert isinstance(g2, favor.Grads) and g2.dw is None
    for a, b in zip(g2[:3], g[:3]):
        assert np.array_equal(a, b)


def test_lambda_and_decay_gradients_match_plain_autograd():
    """dlambda [H, m] and ddecay [H] (causal, per-head gamma) against float64 autograd.
    Needs the C++ kernels to fill the lambda and decay gradients."""
    q, k, v = qkv(seed=16)
    fm = learned_map("positive", M, D, H, seed=17)
    gamma = [0.9, 0.7, 0.95]
    dy = torch.randn(B, H, N, DV, generator=torch.Generator().manual_seed(18),
                     dtype=torch.float64).float().double()

    def autograd(dtype):
        w, b, lam = tensors(fm, dtype)
        lam.requires_grad_()
        g = torch.tensor(gamma, dtype=dtype).float().to(dtype).requires_grad_()
        y = plain.attention_materialised(q.to(dtype), k.to(dtype), v.to(dtype), w, causal=True,
                                         bias=b, lam=lam, decay=g)
        (y * dy.to(dtype)).sum().backward()
        return lam.grad, g.grad

    g = favor.attention_backward(_np(q), _np(k), _np(v), _np(dy), feature_map=fm, causal=True,
                                 decay=gamma, parameter_grads=True)
    assert g.ddecay.shape == (H,) and g.ddecay.dtype == np.float64
    for name, got, ref, naive in zip(("dlambda", "ddecay"), g[5:], autograd(torch.float64),
                                     autograd(torch.float32)):
        assert_twice_naive(got, ref, naive, name)


def test_context_from_the_forward_call_gives_the_same_backward():
    q, k, v = (_np(t) for t in qkv(seed=19))
    fm = learned_map("hedgehog", M, D, H, seed=20)
    out = favor.attention(q, k, v, feature_map=fm, full_output=True)
    assert out.context is not None
    dy = np.ones_like(out.y)
    a = favor.attention_backward(q, k, v, dy, feature_map=fm, context=out.context,
                                 parameter_grads=True)
    b = favor.attention_backward(q, k, v, dy, feature_map=fm, parameter_grads=True)
    for x, y in zip(a[:5], b[:5]):
        assert np.array_equal(x, y)
    other = learned_map("hedgehog", M, D, H, seed=21)
    with pytest.raises(ValueError, match="context"):
        favor.attention_backward(q, k, v, dy, feature_map=other, context=out.context)


# -- decoder ------------------------------------------------------------------------------


@pytest.mark.parametrize("decay", [None, [0.9, 0.8, 0.99]])
def test_decoder_with_a_map_and_decay_equals_causal_attention(decay):
    """Token by token (after a 4-token prefill), query i equals row i of causal attention
    with the same map and decay: both against the float64 formula by the rule."""
    q, k, v = qkv(seed=22)
    fm = learned_map("hedgehog", M, D, H, seed=23)
    dec = favor.Decoder(B, H, DV, feature_map=fm, decay=decay)
    rows = []
    qn, kn, vn = _np(q), _np(k), _np(v)
    dec.append(kn[:, :, :4], vn[:, :, :4])
    rows.append(dec.query(qn[:, :, 3:4]))
    for i in range(4, N):
        dec.append(kn[:, :, i:i + 1], vn[:, :, i:i + 1])
        rows.append(dec.query(qn[:, :, i:i + 1]))
    got = np.concatenate(rows, axis=2)
    ref = plain_attention(q, k, v, fm, causal=True, decay=decay)[:, :, 3:]
    naive = plain_attention(q, k, v, fm, causal=True, decay=decay, dtype=torch.float32)[:, :, 3:]
    assert_twice_naive(got, ref, naive, f"decoder decay={decay}")
    assert dec.position == N


# -- the .npz map format ------------------------------------------------------------------


def test_save_writes_exactly_the_documented_members(tmp_path):
    fm = learned_map("hedgehog", M, D, H, seed=24)
    path = fm.save(tmp_path / "map")
    assert path.endswith("map.npz")
    with np.load(path, allow_pickle=False) as z:
        assert sorted(z.files) == ["bias", "heads", "kernel", "lambda", "projection", "scale",
                                   "weights"]
        assert z["kernel"].dtype == np.dtype("<U16") and z["kernel"].shape == ()
        assert str(z["kernel"]) == "hedgehog"
        assert z["scale"].dtype == np.dtype("<f8") and z["scale"].shape == ()
        assert float(z["scale"]) == 1 / math.sqrt(D)  # the resolved scale
        assert z["heads"].dtype == np.dtype("<i8") and z["heads"].shape == ()
        assert int(z["heads"]) == H
        assert z["projection"].dtype == np.dtype("<f4") and z["projection"].shape == (M, D)
        assert z["weights"].dtype == np.dtype("<f4") and z["weights"].shape == (H, M, D)
        for name in ("bias", "lambda"):
            assert z[name].dtype == np.dtype("<f4") and z[name].shape == (H, M)
        assert np.array_equal(z["weights"], fm.weights) and np.array_equal(z["lambda"], fm.lambda_)
        assert z["projection"].flags.c_contiguous
    # optional members are left out when the map has none
    bare = favor.FeatureMap(fm.projection, kernel="positive", scale=0.5)
    with np.load(bare.save(tmp_path / "bare.npz")) as z:
        assert sorted(z.files) == ["heads", "kernel", "projection", "scale"]
        assert float(z["scale"]) == 0.5 and int(z["heads"]) == 1


def test_save_and_load_round_trip_gives_the_same_attention(tmp_path):
    q, k, v = (_np(t) for t in qkv(seed=25))
    for kernel in LEARNED_KERNELS:
        fm = learned_map(kernel, M, D, H, seed=26)
        back = favor.FeatureMap.load(fm.save(tmp_path / f"{kernel}.npz"))
        assert back.kernel == kernel and back.heads == H and back.scale == 1 / math.sqrt(D)
        for name in ("projection", "weights", "bias", "lambda_"):
            assert np.array_equal(getattr(back, name), getattr(fm, name)), name
        assert np.array_equal(favor.attention(q, k, v, feature_map=back, causal=True),
                              favor.attention(q, k, v, feature_map=fm, causal=True))
        # a path is a feature_map too
        assert np.array_equal(favor.attention(q, k, v, feature_map=tmp_path / f"{kernel}.npz"),
                              favor.attention(q, k, v, feature_map=fm))


def test_load_reads_a_map_written_member_by_member(tmp_path):
    """A file as another writer (the C++ library, the CLI) produces it: np.savez with the
    documented members, and np.savez_compressed (deflate), in any member order."""
    rng = np.random.default_rng(27)
    proj = rng.standard_normal((M, D)).astype("<f4")
    bias = rng.standard_normal((1, M)).astype("<f4")
    lam = (1 + 0.1 * rng.standard_normal((1, M))).astype("<f4")
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, bias=bias, heads=np.array(1, "<i8"), projection=proj,
             scale=np.array(0.3, "<f8"), kernel=np.array("positive", "<U16"),
             **{"lambda": lam})
        fm = favor.FeatureMap.load(path)
        assert fm.kernel == "positive" and fm.heads == 1 and fm.scale == 0.3
        assert fm.weights is None
        assert np.array_equal(fm.projection, proj) and np.array_equal(fm.bias, bias)
        assert np.array_equal(fm.lambda_, lam)


def test_a_bare_npy_is_lambda_alone(tmp_path):
    q, k, v = (_np(t) for t in qkv(seed=28))
    lam = (1 + 0.2 * np.random.default_rng(2).standard_normal((H, M))).astype(np.float32)
    np.save(tmp_path / "lam.npy", lam)
    np.save(tmp_path / "lam1.npy", lam[0])
    w = favor.Projection.draw(M, D, seed=1)
    fm = favor.FeatureMap.load(tmp_path / "lam.npy", projection=w, kernel="hyperbolic")
    assert fm.kernel == "hyperbolic" and fm.heads == H and np.array_equal(fm.lambda_, lam)
    assert favor.FeatureMap.load(tmp_path / "lam1.npy", projection=w).lambda_.shape == (1, M)
    ref = favor.attention(q, k, v, feature_map=fm)
    assert np.array_equal(ref, favor.attention(q, k, v, kernel="hyperbolic", features=M, seed=1,
                                               feature_weights=tmp_path / "lam.npy"))
    with pytest.raises(ValueError, match="projection"):
        favor.FeatureMap.load(tmp_path / "lam.npy")


# The C++ reader's messages (src/io/map_file.hpp, the CLI's --feature-map): "path: <file>"
# then the member and the rule.
@pytest.mark.parametrize("change, match", [
    (lambda z: z.pop("kernel"), "no member 'kernel'"),
    (lambda z: z.update(kernel=np.array(["hedgehog", "trig"])), "member 'kernel'"),
    (lambda z: z.update(kernel=np.array("gaussian", "<U16")), "member 'kernel' is 'gaussian'"),
    (lambda z: z.update(scale=np.array([0.5, 0.5])), "member 'scale'"),
    (lambda z: z.update(heads=np.array(1.0)), "member 'heads': dtype '<f8' is not supported"),
    (lambda z: z.update(heads=np.array(2, "<i8")), "heads"),
    (lambda z: z.update(bias=np.zeros((1, M + 1), "<f4")), "member 'bias' has shape"),
    (lambda z: z.update(projection=np.zeros((M, D), "<i4")),
     "member 'projection': dtype '<i4' is not supported"),
    (lambda z: z.update(**{"lambda": np.zeros((1, M), "<f4")}),
     "lambda.0. = 0.000000: feature weights must be finite and nonzero"),
])
def test_malformed_map_files_raise_value_errors_naming_the_member(tmp_path, change, match):
    z = dict(kernel=np.array("positive", "<U16"), scale=np.array(0.4, "<f8"),
             projection=np.ones((M, D), "<f4"), heads=np.array(1, "<i8"),
             bias=np.zeros((1, M), "<f4"))
    change(z)
    np.savez(tmp_path / "bad.npz", **z)
    with pytest.raises(ValueError, match=match):
        favor.FeatureMap.load(tmp_path / "bad.npz")


def test_load_ignores_unknown_members(tmp_path):
    """As the C++ reader (the CLI's --feature-map): members other than the format's are
    ignored; the format's members are checked as ever."""
    fm = learned_map("hedgehog", M, D, H, seed=31)
    path = fm.save(tmp_path / "map.npz")
    with np.load(path) as z:
        members = dict(z)
    np.savez(tmp_path / "extra.npz", notes=np.array("fitted on wikitext", "<U32"),
             lambdas=np.ones((1, M), "<f4"), version=np.array(3), **members)
    back = favor.FeatureMap.load(tmp_path / "extra.npz")
    for name in ("projection", "weights", "bias", "lambda_"):
        assert np.array_equal(getattr(back, name), getattr(fm, name)), name
    assert back.kernel == "hedgehog" and back.heads == H and back.scale == fm.resolved_scale
    members["heads"] = np.array(2, "<i8")
    np.savez(tmp_path / "bad.npz", notes=np.array("x"), **members)
    with pytest.raises(ValueError, match="heads"):
        favor.FeatureMap.load(tmp_path / "bad.npz")


# -- errors -------------------------------------------------------------------------------


def test_bad_maps_and_decays_raise_value_errors_naming_the_argument(tmp_path):
    q, k, v = (_np(t) for t in qkv(seed=29))
    fm = learned_map("hedgehog", M, D, H, seed=30)
    w = favor.Projection.draw(M, D)
    cases = [
        (lambda: favor.attention(q, k, v, feature_map=fm, kernel="trig"),
         "kernel: the feature_map"),
        (lambda: favor.attention(q, k, v, feature_map=fm, features=M), "features: the feature_map"),
        (lambda: favor.attention(q, k, v, feature_map=fm, scale=0.5), "scale: the feature_map"),
        (lambda: favor.attention(q, k, v, feature_map=fm, feature_weights=np.ones(M)),
         "feature_weights"),
        (lambda: favor.attention(q, k, v, feature_map="nowhere.npz"), "path"),
        (lambda: favor.attention(q, k, v, feature_map=3), "feature_map: must be"),
        (lambda: favor.attention(q, k, v, feature_map=fm, method="exact"), "feature_map: only"),
        (lambda: favor.attention(q, k, v, decay=0.9), "decay: .*causal"),
        (lambda: favor.attention(q, k, v, causal=True, decay=1.5), r"decay\[0\]"),
        (lambda: favor.attention(q, k, v, causal=True, decay=0.0), r"decay\[0\]"),
        (lambda: favor.attention(q, k, v, causal=True, decay=[0.9, 0.9]), "decay: has 2"),
        (lambda: favor.attention(q, k, v, causal=True, decay=[[0.9]]), "decay: shape"),
        (lambda: favor.attention(q, k, v, causal=True, decay="x"), "decay"),
        (lambda: favor.attention(q, k, v, feature_map=learned_map("positive", M, D, 2, seed=1)),
         "feature_map.heads = 2"),
        (lambda: favor.attention(q[..., :4], k[..., :4], v, feature_map=fm), "feature_map"),
        (lambda: favor.attention(q, k, v, feature_weights=np.zeros(M)),
         r"feature_weights\[0\] = 0"),
        (lambda: favor.FeatureMap(w, lambda_=np.zeros(M)), r"feature_map.lambda\[0\]"),
        (lambda: favor.FeatureMap(w, bias=np.full(M, np.nan)), "feature_map.bias"),
        (lambda: favor.FeatureMap(w, weights=np.ones((2, M, D)), heads=3), "weights"),
        (lambda: favor.FeatureMap(w, weights=np.ones((2, M, D)), bias=np.ones((3, M))), "bias"),
        (lambda: favor.FeatureMap(w, weights=np.ones((M, D + 1))), "weights"),
        (lambda: favor.FeatureMap(np.ones(M), kernel="hedgehog"), "projection"),
        (lambda: favor.FeatureMap(w, kernel="gaussian"), "kernel"),
        (lambda: favor.FeatureMap(w, kernel="favorpp", lambda_=np.ones(M)), "feature_map"),
        (lambda: favor.FeatureMap.hedgehog(M, D, heads=0), "heads"),
        (lambda: favor.FeatureMap(w, kernel="favorpp", fit=favor.KernelFit.constant(-0.1, D))
         .save(tmp_path / "f.npz"), "fit"),
        (lambda: favor.Decoder(B, H, DV, w, feature_map=fm), "projection: the feature_map"),
        (lambda: favor.Decoder(B, H, DV, feature_map=fm, decay=[0.5, 0.5]), "decay"),
        (lambda: favor.Decoder(B, 2, DV, feature_map=fm), "feature_map.heads"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


def test_feature_weights_errors_name_feature_weights():
    """feature_weights becomes the lambda of the call's map: its errors name feature_weights
    (not the internal feature_map), checked against the inputs' B = 2, H = 3."""
    q, k, v = (_np(t) for t in qkv(seed=32))
    w = favor.Projection.draw(M, D)
    dy = np.ones((B, H, N, DV), np.float32)
    nan = np.full(M, np.nan, np.float32)
    cases = [
        (lambda: favor.attention(q, k, v, features=M, feature_weights=np.ones((4, M))),
         "^feature_weights: has 4 parameter sets"),
        (lambda: favor.attention(q, k, v, features=M, feature_weights=nan),
         r"^feature_weights\[0\] = nan: feature weights must be finite and nonzero"),
        (lambda: favor.attention(q, k, v, features=M, feature_weights=np.ones(M + 1)),
         "^feature_weights: .*m = 8"),
        (lambda: favor.attention_backward(q, k, v, dy, features=M,
                                          feature_weights=np.ones((2, M))),
         "^feature_weights: has 2 parameter sets"),
        (lambda: favor.features(q, features=M, feature_weights=np.ones((4, M))),
         "^feature_weights: has 4 parameter sets"),
        (lambda: favor.features(q[0, 0], features=M, feature_weights=np.ones((3, M))),
         "^feature_weights: has 3 parameter sets"),
        (lambda: favor.Decoder(B, H, DV, w, feature_weights=np.ones((2, M))),
         "^feature_weights: has 2 parameter sets"),
        (lambda: favor.Decoder(B, H, DV, w, feature_weights=nan), r"^feature_weights\[0\]"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
