"""favor.torch's decoders and the favor::decode_step op: the state leaves and re-enters as
tensors (round trip bit for bit, beam reorder, left padding), and the op's steps equal causal
attention within the float32 bound of test_torch_ops."""
import pytest
import torch

import favor
import favor.torch as ft
from favor import _core
from favor.ops.decoder import decode_step, decode_step_op, empty_state

B, H, N, D, DV, M = 3, 2, 10, 8, 5, 16
W = favor.ops.projection("orthogonal", M, D, seed=7)


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, N, D, generator=g), torch.randn(B, H, N, D, generator=g),
            torch.randn(B, H, N, DV, generator=g))


def steps(dec, q, k, v, begin, end, key_mask=None):
    out = []
    for i in range(begin, end):
        km = None if key_mask is None else key_mask[:, i:i + 1]
        dec.append(k[:, :, i:i + 1], v[:, :, i:i + 1], key_mask=km)
        out.append(dec.query(q[:, :, i:i + 1]))
    return torch.cat(out, 2)


def make(kind):
    if kind == "favor":
        return ft.Decoder(B, H, DV, W)
    g = torch.Generator().manual_seed(9)
    return ft.VQDecoder(B, H, DV, torch.randn(H, 6, D, generator=g), tau=0.5)


@pytest.mark.parametrize("kind", ["favor", "vq"])
def test_state_round_trip_as_tensors(kind):
    q, k, v = qkv()
    a = make(kind)
    steps(a, q, k, v, 0, 5)
    state = a.state()
    assert state["position"] == 5 and all(isinstance(t, torch.Tensor)
                                          for n, t in state.items() if n != "position")
    b = make(kind)
    b.load_state(**state)
    torch.testing.assert_close(steps(a, q, k, v, 5, N), steps(b, q, k, v, 5, N), rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["favor", "vq"])
def test_select_is_a_beam_reorder(kind):
    q, k, v = qkv()
    rows = torch.tensor([2, 0, 0])
    a = make(kind)
    steps(a, q, k, v, 0, 5)
    a.select(rows)
    b = make(kind)
    steps(b, q[rows], k[rows], v[rows], 0, 5)
    torch.testing.assert_close(steps(a, q[rows], k[rows], v[rows], 5, N),
                               steps(b, q[rows], k[rows], v[rows], 5, N), rtol=0, atol=0)


def test_left_padding_equals_the_unpadded_row():
    """Row 0 left-padded by 3 tokens (HF's attention_mask, int64) generates what the same
    row gives alone, unpadded."""
    q, k, v = qkv()
    pad = 3
    mask = torch.ones(B, N, dtype=torch.int64)
    mask[0, :pad] = 0
    padded = steps(ft.Decoder(B, H, DV, W), q, k, v, 0, N, key_mask=mask)
    alone = steps(ft.Decoder(1, H, DV, W), q[:1, :, pad:], k[:1, :, pad:], v[:1, :, pad:],
                  0, N - pad)
    torch.testing.assert_close(padded[:1, :, pad:], alone, rtol=0, atol=0)


def bound(y):
    """test_torch_ops' float32 bound: a few ulps of the output's scale per accumulation."""
    return 64 * 2.0 ** -24 * N * max(1.0, y.abs().max().item())


@pytest.mark.parametrize("kernel,fit", [("positive", None), ("trig", None),
                                        ("hyperbolic", None), ("favorpp", True)])
def test_decode_step_op_equals_causal_attention(kernel, fit):
    q, k, v = qkv(1)
    q, k = q * 0.5, k * 0.5
    fit_pair = None
    if fit:
        kf = favor.fit_kernel(kernel, q.numpy(), k.numpy())
        fit_pair = (torch.from_numpy(kf.a), torch.from_numpy(kf.basis))
    state = empty_state(B, H, DV, _core.feature_count(kernel, M))
    out = []
    for i in range(N):
        y, state = decode_step(state, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], W,
                               kernel=kernel, fit=fit_pair)
        out.append(y)
    ref = ft.attention(q, k, v, projection=W, kernel=kernel, causal=True,
                       fit=None if fit_pair is None else _core.KernelFit(*(t.numpy()
                                                                            for t in fit_pair)))
    got = torch.cat(out, 2)
    assert (got - ref).abs().max().item() <= bound(ref)
    assert int(state[3]) == N


def learned_map(seed=12):
    """Per-head hedgehog weights, bias and feature weights, and a decay per head."""
    g = torch.Generator().manual_seed(seed)
    return dict(weights=0.3 * torch.randn(H, M, D, generator=g),
                bias=0.1 * torch.randn(H, M, generator=g),
                feature_weights=1 + 0.1 * torch.randn(H, M, generator=g),
                decay=torch.tensor([0.9, 0.75], dtype=torch.float64))


@pytest.mark.parametrize("kernel", ["hedgehog", "positive"])
def test_decode_step_op_with_a_learned_map_and_decay_equals_causal_attention(kernel):
    """The learned map (favor::attention's tensors, built by the same rule) and the decay in
    the decoder step: row i equals causal favor.torch.attention with the same map."""
    q, k, v = (t * 0.5 for t in qkv(2))
    lm = learned_map()
    state = empty_state(B, H, DV, _core.feature_count(kernel, M))
    out = []
    for i in range(N):
        y, state = decode_step(state, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], W,
                               kernel=kernel, **lm)
        out.append(y)
    ref = ft.attention(q, k, v, projection=W, kernel=kernel, causal=True, **lm)
    got = torch.cat(out, 2)
    assert (got - ref).abs().max().item() <= bound(ref)
    without_decay = ft.attention(q, k, v, projection=W, kernel=kernel, causal=True,
                                 **dict(lm, decay=None))
    assert (got - without_decay).abs().max().item() > 100 * bound(ref)  # the decay is applied


def test_decode_step_leaves_its_inputs_alone():
    q, k, v = qkv()
    state = empty_state(B, H, DV, _core.feature_count("positive", M))
    before = [t.clone() for t in state]
    decode_step(state, q[:, :, :2], k[:, :, :2], v[:, :, :2], W)
    for a, b in zip(state, before):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("mask", [False, True])
def test_opcheck_decode_step(mask):
    q, k, v = qkv()
    state = empty_state(B, H, DV, _core.feature_count("positive", M))
    _, state = decode_step(state, q[:, :, :3], k[:, :, :3], v[:, :, :3], W)
    key_mask = torch.tensor([[1, 1], [0, 1], [0, 0]], dtype=torch.float32) if mask else None
    for mode in ("append_query", "prefill", "append", "query"):
        # 'append' takes a q of no token, 'query' a k and v of none
        qs, ks, vs = q[:, :, 3:5], k[:, :, 3:5], v[:, :, 3:5]
        if mode == "append":
            qs = q[:, :, :0]
        if mode == "query":
            ks, vs, mask_m = k[:, :, :0], v[:, :, :0], None
        else:
            mask_m = key_mask
        torch.library.opcheck(decode_step_op, (*(t.clone() for t in state), qs, ks, vs, mask_m,
                                               W, "positive", None, None, None, None, None,
                                               None, None, mode))


def test_opcheck_decode_step_learned_map():
    q, k, v = qkv()
    lm = learned_map()
    state = empty_state(B, H, DV, _core.feature_count("hedgehog", M))
    _, state = decode_step(state, q[:, :, :3], k[:, :, :3], v[:, :, :3], W, kernel="hedgehog",
                           **lm)
    torch.library.opcheck(decode_step_op, (*state, q[:, :, 3:5], k[:, :, 3:5], v[:, :, 3:5],
                                           None, W, "hedgehog", None, None, None, lm["weights"],
                                           lm["bias"], lm["feature_weights"], lm["decay"],
                                           "append_query"))


def test_decode_step_compiles_fullgraph():
    q, k, v = qkv()

    def step(state, q, k, v):
        return decode_step(state, q, k, v, W)

    state = empty_state(B, H, DV, _core.feature_count("positive", M))
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    s_e, s_c = state, state
    for i in range(3):
        y_e, s_e = step(s_e, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1])
        y_c, s_c = compiled(s_c, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1])
        torch.testing.assert_close(y_c, y_e, rtol=0, atol=0)


def test_the_dispatched_cpu_kernel_builds_the_cpp_map_once_per_map(monkeypatch):
    """favor::decode_step's CPU kernel called through torch's dispatcher (a compiled step,
    favor.ops.decode_step) builds the C++ decoder of a map once and reuses it while the map's
    values are the same; a map changed in place (same tensor, new values) is rebuilt, and the
    rows follow it."""
    from favor.ops.decoder import op
    built = []
    real = op._decoder
    monkeypatch.setattr(op, "_decoder", lambda *a: built.append(1) or real(*a))
    op._BUILT.clear()
    g = torch.Generator().manual_seed(2)
    w = torch.randn(16, 8, generator=g)
    state = empty_state(1, 2, 4, 16)
    q, k, v = (torch.randn(1, 2, 1, 8 if i < 2 else 4, generator=g) for i in range(3))
    args = lambda: (*state, q, k, v, None, w, "positive", None, None, None, None, None,  # noqa
                    None, None, "step")
    ys = [decode_step_op(*args()) for _ in range(3)]
    assert len(built) == 1
    w.mul_(0.5)  # the same tensor, other values: another map
    fresh = empty_state(1, 2, 4, 16)
    y_new = decode_step_op(*fresh, q, k, v, None, w, "positive", None, None, None, None, None,
                           None, None, "step")
    assert len(built) == 2
    ref = decode_step_op(*empty_state(1, 2, 4, 16), q, k, v, None, w.clone(), "positive",
                         None, None, None, None, None, None, None, "step")
    assert torch.equal(y_new, ref) and not torch.equal(y_new, ys[0])
