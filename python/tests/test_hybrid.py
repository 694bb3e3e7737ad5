"""Hybrid attention (window and sinks: exact softmax on each query's window and the first kept
keys, FAVOR's estimator beyond, one normaliser) through every entry point: the numpy API, the
torch op and modules, the CLI, favor.torch.HybridDecoder (decoding over a prompt equals the
causal rows, with left padding, decay and beam reorder; a fixed state size) and favor.hf
(conversion, generation, transfer with window dropout). The kernels themselves are checked
against the float64 oracles in test_conformance.py, test_hybrid_generic.py and
tests/test_hybrid.cpp."""
import sys

import numpy as np
import pytest
import torch

import favor
import favor.torch as ft
from favor.ops.hybrid import HybridDecodeState
from test_cli_parity import cli_attention

B, H, N, D = 2, 3, 30, 8


def qkv(n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g) * 0.6 for _ in range(3)]


def projection(m=32):
    return torch.tensor(favor.make_projection(D, "orthogonal", features=m, seed=3).matrix)


def left_padding(n=N, pad=5):
    mask = torch.zeros(B, n, dtype=torch.bool)  # torch's convention: True = ignore
    mask[1, :pad] = True
    return mask


@pytest.mark.parametrize("causal", [True, False])
def test_numpy_api_equals_the_torch_op(causal):
    q, k, v = qkv()
    y = ft.attention(q, k, v, causal=causal, window=6, sinks=2, features=32)
    yn = favor.attention(q.numpy(), k.numpy(), v.numpy(), causal=causal, window=6, sinks=2,
                         features=32)
    assert np.array_equal(y.numpy(), yn)


@pytest.mark.parametrize("causal", [True, False])
def test_a_window_covering_the_sequence_is_exact_softmax(causal):
    q, k, v = qkv()
    mask = left_padding()
    for backend in ("cpu", "torch"):
        y = ft.attention(q, k, v, causal=causal, window=N, key_padding_mask=mask,
                         backend=backend)
        ref = ft.attention(q.double(), k.double(), v.double(), causal=causal, method="exact",
                           key_padding_mask=mask)
        assert (y.double() - ref).abs().max() < 1e-6, backend


@pytest.mark.parametrize("causal", [True, False])
def test_no_window_no_sinks_is_the_plain_method_bit_for_bit(causal):
    q, k, v = qkv()
    for backend in ("cpu", "torch"):
        a = ft.attention(q, k, v, causal=causal, window=0, sinks=0, backend=backend)
        b = ft.attention(q, k, v, causal=causal, backend=backend)
        assert torch.equal(a, b), backend


def test_the_estimator_carries_the_keys_beyond_the_window():
    """The hybrid differs from its window alone and from the plain method: both parts count."""
    q, k, v = qkv()
    hybrid = ft.attention(q, k, v, causal=True, window=4, sinks=1, features=256)
    plain = ft.attention(q, k, v, causal=True, features=256)
    exact = ft.attention(q, k, v, causal=True, method="exact")
    err = lambda y: float((y - exact).norm() / exact.norm())  # noqa: E731
    assert err(hybrid) < err(plain)


@pytest.mark.parametrize("causal", [True, False])
def test_method_window_is_the_window_and_sinks_alone(causal):
    """method='window': the hybrid's exact part alone. It equals exact softmax once the
    window covers the sequence, and otherwise differs from the hybrid only by the estimated
    terms (a hybrid whose sinks cover every key has none)."""
    q, k, v = qkv()
    mask = left_padding()
    y = ft.attention(q, k, v, causal=causal, method="window", window=N, key_padding_mask=mask)
    ref = ft.attention(q, k, v, causal=causal, method="exact", key_padding_mask=mask)
    assert (y - ref).abs().max() < 1e-6
    a = ft.attention(q, k, v, causal=causal, method="window", window=3, sinks=N,
                     key_padding_mask=mask)
    b = ft.attention(q, k, v, causal=causal, window=3, sinks=N, key_padding_mask=mask)
    assert (a - b).abs().max() < 1e-6
    with pytest.raises(ValueError, match="give window > 0 or sinks > 0"):
        ft.attention(q, k, v, method="window")
    with pytest.raises(ValueError, match="method: 'window' takes no feature map"):
        ft.attention(q, k, v, method="window", window=3, decay=0.9, causal=True)


@pytest.mark.parametrize("causal", [True, False])
def test_method_window_runs_cpp_on_the_cpu_and_equals_the_torch_band(causal):
    """method='window' is favor::exact_attention with window and sinks: on the CPU C++'s band
    kernel (ExactOptions::window), elsewhere the torch band; both give the same rows and
    gradients, and the op compiles as one node (fullgraph)."""
    q, k, v = qkv(n=70)
    mask = left_padding(70)
    outs = []
    for backend in (None, "torch"):
        ts = [t.clone().requires_grad_() for t in (q, k, v)]
        y = ft.attention(*ts, causal=causal, method="window", window=9, sinks=2,
                         key_padding_mask=mask, backend=backend)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        outs.append([y.detach()] + [t.grad for t in ts])
    for cpp, band in zip(*outs):
        assert (cpp - band).norm() <= 1e-6 * band.norm()
    y = favor._core.exact_attention(*(t.numpy() for t in (q, k, v)), causal=causal, window=9,
                                    sinks=2, key_mask=(~mask).numpy())
    assert np.array_equal(y, outs[0][0].numpy())
    # under autograd the CPU op saves the band's lse: the backward reads it (no second band
    # forward) and gives the recomputing backward's gradients bit for bit
    from favor.ops.exact import op
    contexts = []
    real = favor._core.exact_attention_backward

    def recording(*args, **kwargs):
        contexts.append(kwargs.get("context"))
        return real(*args, **kwargs)
    try:
        op._core.exact_attention_backward = recording
        ts = [t.clone().requires_grad_() for t in (q, k, v)]
        y = ft.attention(*ts, causal=causal, method="window", window=9, sinks=2,
                         key_padding_mask=mask)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    finally:
        op._core.exact_attention_backward = real
    assert len(contexts) == 1 and contexts[0] is not None
    grads = [t.grad for t in ts]
    recomputed = favor._core.exact_attention_backward(
        *(t.numpy() for t in (q, k, v)),
        (torch.linspace(-1, 1, y.numel()).reshape(y.shape)).numpy(), causal=causal,
        window=9, sinks=2, key_mask=(~mask).numpy())
    for g, r in zip(grads, recomputed[:3]):
        assert np.array_equal(g.numpy(), r)
    f = torch.compile(lambda a, b, c: ft.attention(a, b, c, causal=causal, method="window",
                                                   window=9, sinks=2), fullgraph=True)
    assert torch.equal(f(q, k, v), ft.attention(q, k, v, causal=causal, method="window",
                                                window=9, sinks=2))


def test_bad_window_and_sinks_are_refused_naming_them():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="window: -1 must be >= 0"):
        ft.attention(q, k, v, window=-1)
    with pytest.raises(ValueError, match="sinks: -2 must be >= 0"):
        favor.attention(q.numpy(), k.numpy(), v.numpy(), sinks=-2)
    with pytest.raises(ValueError, match="Nq == Nk"):
        ft.attention(q[:, :, :5], k, v, window=3)
    with pytest.raises(ValueError, match="window: must be an integer"):
        ft.attention(q, k, v, window=2.5)
    with pytest.raises(ValueError, match="sinks: must be an integer"):
        favor.attention(q.numpy(), k.numpy(), v.numpy(), sinks=None)
    assert torch.equal(ft.attention(q, k, v, window=np.int64(3)), ft.attention(q, k, v, window=3))
    with pytest.raises(ValueError, match="window: -2 must be >= 0"):
        ft.FavorAttention(16, 2, window=-2)
    with pytest.raises(ValueError, match="give window > 0 or sinks > 0"):
        ft.FavorAttention(16, 2, method="window")
    layer = ft.FavorAttention(16, 2, window=3)
    x = torch.randn(2, 10, 16)
    with pytest.raises(ValueError, match="hybrid attention is self-attention"):
        layer(x, torch.randn(2, 10, 16))  # cross-attention of equal length
    mha = ft.MultiheadAttention(16, 2, batch_first=True, window=3, warn_dropout=False)
    with pytest.raises(ValueError, match="hybrid attention is self-attention"):
        mha(x, x.clone(), x.clone(), need_weights=False)
    with pytest.raises(ValueError, match="method: 'exact' takes no"):
        ft.attention(q, k, v, method="exact", window=3)
    with pytest.raises(ValueError, match="window: only method='favor'"):
        favor.attention(q.numpy(), k.numpy(), v.numpy(), method="exact", window=3)
    with pytest.raises(ValueError, match="window: -1 must be >= 0"):
        ft.attention(q, k, v, window=-1, backend="torch")


def test_gradients_flow_through_both_parts_and_compile():
    q, k, v = (t.requires_grad_() for t in qkv())
    w = projection().requires_grad_()
    y = ft.attention(q, k, v, causal=True, window=5, sinks=2, projection=w)
    grads = torch.autograd.grad(y.square().sum(), (q, k, v, w))
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    f = torch.compile(lambda a, b, c: ft.attention(a, b, c, causal=True, window=5, sinks=2,
                                                   projection=w.detach()), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(f(q, k, v), ft.attention(q, k, v, causal=True, window=5, sinks=2,
                                                    projection=w.detach()))


@pytest.mark.parametrize("window,sinks", [(5, 2), (0, 3), (40, 1)])
@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("causal", [True, False])
def test_saved_causal_states_give_the_gradients_of_a_recomputation(window, sinks, mapped,
                                                                   causal):
    """save_causal_states on a hybrid call: the CPU op carries the estimated parts' chunk
    states and rows (bidirectional: the prefix's and the suffix's) and the merged rows (N =
    70: a part's view spans three chunks; 65 with window 0, whose parts' views of 65 and 64
    rows hold 4 and 3 chunk states), and its backward gives the recomputing backward's
    gradients (causal the same bits, bidirectional to rounding); window >= N (40 + 1 sink
    covers every key of N = 30) saves nothing. A learned map (weights, bias) takes the same
    context. Without save_causal_states a hybrid call saves nothing, bidirectional too."""
    n = 65 if window == 0 else 70 if window < 40 else 30
    q, k, v = qkv(n=n)
    w = projection()
    mask = left_padding(n)
    grads = []
    for save in (False, True):
        ts = [t.clone().requires_grad_() for t in (q, k, v)]
        extra = {"weights": w.clone().requires_grad_(),
                 "bias": torch.zeros(1, 32, requires_grad=True)} if mapped else {"projection": w}
        y = ft.attention(*ts, causal=causal, window=window, sinks=sinks,
                         key_padding_mask=mask, save_causal_states=save, **extra)
        saved = y.grad_fn.saved_tensors  # Formula.setup_context's order
        assert int(saved[14][0]) == (1 if save and window < n else 0)  # fingerprint[0]: valid
        assert (saved[12].numel() > 0) == (save and window < n)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        grads.append([t.grad for t in ts] + ([extra["weights"].grad] if mapped else []))
    for plain_grad, saved_grad in zip(*grads):  # causal: the same path, the same bits
        if causal:
            assert torch.equal(saved_grad, plain_grad)
        else:
            assert (saved_grad - plain_grad).norm() <= 1e-5 * plain_grad.norm()
    from favor.ops.attention.op import _state_size, attention_op
    args = (q, k, v, w, None, None, None, None, mask, None, None, "positive", causal, None,
            True, "f32", window, sinks)
    _, states, maxima, fingerprint, rows = attention_op(*args)
    sizes = favor._core.hybrid_context_sizes(B * H, n, 32, D, window, causal)
    assert _state_size(q, v, w, "positive", causal, window, sinks) == (
        sizes[0] + sizes[2], sizes[1], sizes[2])
    assert states.numel() == sizes[0] and rows.numel() == sizes[2]
    assert maxima.numel() == sizes[1]
    assert int(fingerprint[0]) == (1 if window < n else 0)
    if not causal and window == 0:  # the prefix's and the suffix's numbers of states differ
        assert favor._core.causal_context_states(n) != favor._core.causal_context_states(n - 1)


def test_modules_take_window_and_sinks():
    layer = ft.FavorAttention(16, 2, causal=True, features=32, window=4, sinks=1)
    x = torch.randn(2, 20, 16)
    y = layer(x)
    assert y.shape == x.shape
    assert isinstance(layer.core.decoder(2), ft.HybridDecoder)
    mha = ft.MultiheadAttention(16, 2, batch_first=True, features=32, window=3,
                                warn_dropout=False)
    out, _ = mha(x, x, x, need_weights=False)
    assert out.shape == x.shape
    with pytest.raises(ValueError, match="hybrid attention is method='favor'"):
        ft.FavorAttention(16, 2, method="exact", window=4)


def test_cli_window_and_sinks_equal_the_numpy_api(favor_cli, tmp_path):
    q, k, v = (t.numpy() for t in qkv())
    y = cli_attention(favor_cli, tmp_path, q, k, v, "--causal", "--window", 6, "--sinks", 2)
    assert np.array_equal(y, favor.attention(q, k, v, causal=True, window=6, sinks=2))


# ---- decoding ------------------------------------------------------------------------------

@pytest.mark.parametrize("window,sinks,decay", [(6, 2, None), (0, 3, None),
                                                (5, 0, [0.9, 0.95, 0.99]), (4, 2, [0.93]),
                                                (N + 5, 1, None)])
@pytest.mark.parametrize("split", [0, 7, 13])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_decoding_a_prompt_equals_the_causal_rows(window, sinks, decay, split, backend):
    """prefill of the first `split` tokens then one step per token, a left-padded batch:
    the rows of causal hybrid attention (same window, sinks, decay; decay counts from the
    window's edge in both), on both kernels of favor::hybrid_decode_step (the C++ decoder,
    torch operations)."""
    q, k, v = qkv()
    pad, w = left_padding(), projection()
    extra = {} if decay is None else dict(decay=decay)
    ref = ft.attention(q, k, v, causal=True, window=window, sinks=sinks, projection=w,
                       key_padding_mask=pad, **extra)
    dec = ft.HybridDecoder(B, H, D, w, window=window, sinks=sinks, backend=backend, **extra)
    keep = ~pad
    outs = [dec.prefill(q[:, :, :split], k[:, :, :split], v[:, :, :split],
                        key_mask=keep[:, :split])] if split else []
    sizes = set()
    for i in range(split, N):
        outs.append(dec.step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                             key_mask=keep[:, i:i + 1]))
        sizes.add(dec.state_bytes)
    assert (torch.cat(outs, 2) - ref).abs().max() < 1e-5
    assert len(sizes) == 1  # the state does not grow


def test_the_op_kernels_agree_on_learned_maps_beams_and_state():
    """FavorCore.decoder (what favor.hf's cache layers make) with a learned map, lambda and
    decay: the op's CPU kernel (the C++ decoder on the state's memory) equals its torch
    kernel step by step, after a beam reorder, with states of one layout (a state saved on
    one kernel loads and steps on the other, the same rows); the owner's state() and
    load_state() round-trip bit for bit."""
    torch.manual_seed(3)
    core = ft.FavorCore(H, D, features=16, causal=True, window=5, sinks=2,
                        learn_features=True, feature_weights=True, decay=0.97)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.2 * torch.randn_like(p))
    q, k, v = qkv()
    keep = ~left_padding()
    rows = [1, 0, 1]
    outs = []
    with torch.no_grad():
        for backend in ("cpu", "torch"):
            dec = core.decoder(B)
            dec.backend = backend
            y = [dec.prefill(q[:, :, :9], k[:, :, :9], v[:, :, :9], key_mask=keep[:, :9])]
            dec.select(rows)
            y += [dec.step(q[rows][:, :, i:i + 1], k[rows][:, :, i:i + 1],
                           v[rows][:, :, i:i + 1], key_mask=keep[rows][:, i:i + 1])
                  for i in range(9, N - 2)]
            outs.append((y[0], torch.cat(y[1:], 2), dec))
    assert (outs[0][0] - outs[1][0]).abs().max() < 1e-5
    assert (outs[0][1] - outs[1][1]).abs().max() < 1e-5
    cpu, tor = outs[0][2], outs[1][2]
    assert cpu.batch == 3 and cpu.state_bytes == tor.state_bytes
    saved = cpu.state()
    tail = [q[rows][:, :, N - 2:], k[rows][:, :, N - 2:], v[rows][:, :, N - 2:]]
    with torch.no_grad():
        a = cpu.prefill(*tail)
        tor.load_state(**saved)  # the CPU kernel's state on the torch kernel
        b = tor.prefill(*tail)
        cpu.load_state(**saved)
        c = cpu.prefill(*tail)
    assert torch.equal(a, c)
    assert (a - b).abs().max() < 1e-5
    with pytest.raises(ValueError, match="position: -1 must be an integer >= 0"):
        cpu.load_state(**dict(saved, position=-1))
    with pytest.raises(ValueError, match="sink_pos"):
        cpu.load_state(**dict(saved, sink_pos=torch.full_like(saved["sink_pos"], 99)))


def test_a_window_only_decoder_equals_method_window(monkeypatch):
    """The window and the sinks alone decode as method='window' computes; on the CPU the
    prompt is C++'s band kernel (the op's CPU kernel never runs the torch band, whose blocks
    held hundreds of MiB at 8k tokens), the ring's steps torch operations."""
    from favor.ops.hybrid import chunk

    def refuse(*args, **kwargs):
        raise AssertionError("the torch band ran on the CPU")
    q, k, v = qkv()
    pad = left_padding()
    ref = ft.attention(q, k, v, causal=True, method="window", window=5, sinks=2,
                       key_padding_mask=pad)
    first = ft.attention(q[:, :, :9], k[:, :, :9], v[:, :, :9], causal=True, method="window",
                         window=5, sinks=2, key_padding_mask=pad[:, :9])
    monkeypatch.setattr(chunk, "window_attention", refuse)
    monkeypatch.setattr(chunk, "_window_blocks", refuse)
    dec = ft.HybridDecoder(B, H, D, projection(), window=5, sinks=2, estimate=False)
    keep = ~pad
    outs = [dec.prefill(q[:, :, :9], k[:, :, :9], v[:, :, :9], key_mask=keep[:, :9])]
    assert torch.equal(outs[0], first)
    outs += [dec.step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                      key_mask=keep[:, i:i + 1]) for i in range(9, N)]
    assert (torch.cat(outs, 2) - ref).abs().max() < 1e-5


def test_decoder_select_keeps_each_heads_fit_constant():
    """FAVOR# with a fit per head (H sets): after select the heads keep their own constant."""
    q, k, v = qkv(n=12)
    fit = favor.fit_kernel("favorsharp", q[:1].numpy(), k[:1].numpy())
    ref = ft.attention(q[[0, 0]], k[[0, 0]], v[[0, 0]], causal=True, window=3, sinks=1,
                       kernel="favorsharp", fit=fit, projection=projection())
    dec = ft.HybridDecoder(1, H, D, projection(), window=3, sinks=1, kernel="favorsharp",
                           fit=fit)
    dec.prefill(q[:1, :, :8], k[:1, :, :8], v[:1, :, :8])
    dec.select([0, 0])
    y = torch.cat([dec.step(q[[0, 0]][:, :, i:i + 1], k[[0, 0]][:, :, i:i + 1],
                            v[[0, 0]][:, :, i:i + 1]) for i in range(8, 12)], 2)
    assert (y - ref[:, :, 8:]).abs().max() < 1e-5


@pytest.mark.parametrize("decay", [None, 0.95])
def test_the_numpy_decoder_is_cpp_hybrid_decoder(decay):
    """favor.Decoder(window=, sinks=) (C++ favor::HybridDecoder) equals favor.attention's
    causal rows and favor.torch.HybridDecoder's steps."""
    q, k, v = (t.numpy() for t in qkv())
    keep = (~left_padding()).numpy()
    p = favor.make_projection(D, "orthogonal", features=32, seed=3)
    extra = {} if decay is None else dict(decay=decay)
    ref = favor.attention(q, k, v, causal=True, window=5, sinks=2, key_mask=keep,
                          projection=p, features=32, **extra)
    dec = favor.Decoder(B, H, D, p, window=5, sinks=2, **extra)
    ys = [dec.prefill(q[:, :, :9], k[:, :, :9], v[:, :, :9], key_mask=keep[:, :9])]
    ys += [dec.step(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1],
                    key_mask=keep[:, i:i + 1]) for i in range(9, N)]
    assert np.abs(np.concatenate(ys, 2) - ref).max() < 1e-5
    assert dec.window == 5 and dec.sinks == 2 and dec.position == N
    with pytest.raises(ValueError, match="both 0 is the plain method"):
        favor._core.HybridDecoder(1, 1, 4, favor.FeatureMap(p.matrix).core(), 0)


def test_decoder_select_reorders_like_a_beam_search():
    q, k, v = qkv()
    w = projection()
    dec = ft.HybridDecoder(B, H, D, w, window=4, sinks=2)
    dec.prefill(q[:, :, :10], k[:, :, :10], v[:, :, :10])
    rows = [1, 1, 0]
    dec.select(rows)
    y = dec.step(q[rows][:, :, 10:11], k[rows][:, :, 10:11], v[rows][:, :, 10:11])
    ref = ft.attention(q[rows][:, :, :11], k[rows][:, :, :11], v[rows][:, :, :11], causal=True,
                       window=4, sinks=2, projection=w)[:, :, 10:]
    assert (y - ref).abs().max() < 1e-5


def test_decoder_state_round_trips_and_decoder_takes_window():
    q, k, v = qkv()
    w = projection()
    dec = ft.Decoder(B, H, D, w, window=5, sinks=2, decay=[0.95])
    assert isinstance(dec, ft.HybridDecoder)
    dec.prefill(q[:, :, :12], k[:, :, :12], v[:, :, :12])
    saved = dec.state()
    a = dec.step(q[:, :, 12:13], k[:, :, 12:13], v[:, :, 12:13])
    fresh = ft.HybridDecoder(B, H, D, w, window=5, sinks=2, decay=[0.95])
    fresh.load_state(**saved)
    assert torch.equal(fresh.step(q[:, :, 12:13], k[:, :, 12:13], v[:, :, 12:13]), a)
    bad = dict(saved, ring_k=saved["ring_k"][:, :, :2])
    with pytest.raises(ValueError, match=r"ring_k: shape \[2,3,2,8\] must be \[batch, heads, "
                                         r"window, d\]"):
        fresh.load_state(**bad)


def test_decoder_state_size_is_fixed_by_window_sinks_and_m():
    w = projection(32)
    small = ft.HybridDecoder(1, H, D, w, window=4, sinks=1)
    big = ft.HybridDecoder(1, H, D, w, window=64, sinks=4)
    q, k, v = qkv(n=80)
    for dec in (small, big):
        before = dec.state_bytes
        dec.prefill(q[:1], k[:1], v[:1])
        assert dec.state_bytes == before
    ring = lambda wn, s: H * (wn + s) * 2 * D * 4  # noqa: E731 (keys and values, float32)
    assert big.state_bytes - small.state_bytes >= ring(64, 4) - ring(4, 1)
    # the window and sinks alone (estimate=False) hold no linear state: ring, sinks and their
    # masks and positions only
    alone = ft.HybridDecoder(1, H, D, w, window=64, sinks=4, estimate=False)
    alone.prefill(q[:1], k[:1], v[:1])
    # (and an empty linear state: F = 0 features, its stabilisers and clock)
    assert alone.state_bytes == ring(64, 4) + 64 * 2 + 4 * 8 + H * 8 + 8


def test_decoder_errors():
    with pytest.raises(ValueError, match="window: -1 must be >= 0"):
        ft.HybridDecoder(B, H, D, projection(), window=-1)
    with pytest.raises(ValueError, match="both 0 is the plain method"):
        ft.HybridDecoder(B, H, D, projection(), window=0, sinks=0)


# ---- favor.hf ------------------------------------------------------------------------------

hf_models = pytest.importorskip("hf_models")


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_a_conversion_whose_window_covers_the_input_is_the_original(family):
    fh = pytest.importorskip("favor.hf")
    m = hf_models.make(family)
    ids, mask = hf_models.inputs(n=12, left=family != "bert")
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=mask)[0]
        gen = None if family == "bert" else m.generate(input_ids=ids, attention_mask=mask,
                                                       max_new_tokens=6, do_sample=False)
    fh.convert(m, "favor", window=64, sinks=2, features=32)
    with torch.no_grad():
        got = m(input_ids=ids, attention_mask=mask)[0]
    assert (got - ref)[mask.bool()].abs().max() < 1e-4
    if gen is not None:
        assert torch.equal(m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6,
                                      do_sample=False), gen)


def test_a_hybrid_mistral_serves_calls_beyond_its_sliding_window_and_beams():
    fh = pytest.importorskip("favor.hf")
    m = hf_models.make("mistral", sliding_window=8)
    ids, mask = hf_models.inputs(n=12)
    fh.convert(m, "favor", window=4, sinks=1, features=32)
    out = m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, num_beams=2,
                     do_sample=False)
    assert out.shape == (B, 17)
    plain = hf_models.make("mistral", sliding_window=8)
    fh.convert(plain, "favor", features=32)
    with pytest.raises(ValueError, match="outrun the model's window"):
        plain(input_ids=ids, attention_mask=mask)


def test_generate_gives_back_what_each_prompt_layer_freed(monkeypatch):
    """The cache layers hand the allocator's freed memory back to the system after each
    layer's prompt and when the cache is dropped (favor.release_freed_memory; glibc keeps a
    long prompt's freed buffers otherwise, docs/hf.md "Memory"), and a hybrid layer holds one
    HybridDecodeState (the C++ decoder lends its map only)."""
    fh = pytest.importorskip("favor.hf")
    import gc
    calls = []
    monkeypatch.setattr(favor._core, "release_freed_memory", lambda: calls.append(1) or True)
    m = hf_models.make("llama")
    ids, mask = hf_models.inputs(n=12)
    fh.convert(m, "favor", window=4, sinks=1, features=32)
    cache = fh.FavorCache()
    with torch.no_grad():
        m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
                   cache=cache)
    layers = len(cache.layers)
    assert layers > 0 and len(calls) == layers  # one per layer's prompt
    decoders = [layer.decoder for layer in cache.layers]
    assert all(isinstance(d._state, HybridDecodeState) and d._d is not None
               for d in decoders)  # one state, stepped by the C++ decoder on its memory
    del cache, decoders
    gc.collect()
    assert len(calls) == 2 * layers  # and one per layer as the cache goes
    assert favor.release_freed_memory() in (True, False)


def test_transfer_fits_with_window_dropout_deterministically():
    fh = pytest.importorskip("favor.hf")
    ids, mask = hf_models.inputs(n=40, pad=3)
    batches = [dict(input_ids=ids, attention_mask=mask)]
    reports, maps = [], []
    for dropout in (0.5, 0.5, 0.0):
        m = hf_models.make("llama")
        fh.convert(m, "hedgehog", window=4, sinks=1, features=16)
        reports.append(fh.transfer(m, batches, steps=20, progress=False,
                                   window_dropout=dropout))
        maps.append([p.detach().clone() for p in m.parameters() if p.requires_grad])
    assert "with the window shortened" in reports[0][0]["fitted"]
    assert all(torch.equal(a, b) for a, b in zip(maps[0], maps[1]))  # seeded draws
    assert not all(torch.equal(a, b) for a, b in zip(maps[0], maps[2]))
    for r in reports[0]:
        assert r["error_after"] < r["error_before"]
    with pytest.raises(ValueError, match="window_dropout"):
        fh.transfer(m, batches, steps=1, progress=False, window_dropout=2)
    with pytest.raises(ValueError, match="window: not an option of method vq"):
        fh.convert(hf_models.make("llama"), "vq", window=4)


def test_method_window_converts_generates_and_has_nothing_to_fit():
    fh = pytest.importorskip("favor.hf")
    m = hf_models.make("llama")
    ids, mask = hf_models.inputs(n=20, pad=3)
    fh.convert(m, "window", window=4, sinks=1)
    report = fh.transfer(m, [dict(input_ids=ids, attention_mask=mask)], steps=5,
                         progress=False)
    assert report[0]["fitted"] == "nothing (window)"
    assert report[0]["error_before"] == report[0]["error_after"] > 0
    with torch.no_grad():
        full = m(input_ids=ids, attention_mask=mask, use_cache=False).logits
        cache = fh.FavorCache()
        parts = [m(input_ids=ids[:, :12], attention_mask=mask[:, :12], past_key_values=cache,
                   use_cache=True).logits]
        parts += [m(input_ids=ids[:, i:i + 1], attention_mask=mask[:, :i + 1],
                    past_key_values=cache, use_cache=True).logits for i in range(12, 20)]
    assert (torch.cat(parts, 1) - full)[mask.bool()].abs().max() < 1e-4


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
