"""favor._core.Decoder / VQDecoder.append(k, v, key_mask): a left-padded batch appended with
its mask equals each row's tokens appended alone, bit for bit (both run the same float32
operations on the kept tokens); a masked token adds nothing and, with decay, does not decay."""
import numpy as np
import pytest

from favor import _core

B, H, N, D, DV, M, C = 3, 2, 16, 8, 5, 16, 7
PADS = [0, 3, 9]


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


Q, K, V = rand((B, H, N, D), 1), rand((B, H, N, D), 2), rand((B, H, N, DV), 3)
MASK = np.array([[j >= p for j in range(N)] for p in PADS])
W = _core.Projection.draw(M, D, seed=7)
FM = _core.FeatureMap(W, "positive")
MAKERS = {
    "favor": lambda b: _core.Decoder(b, H, DV, W),
    "favor_decay": lambda b: _core.Decoder(b, H, DV, feature_map=FM, decay=[0.9, 0.7]),
    "vq": lambda b: _core.VQDecoder(b, H, DV, rand((H, C, D), 4), tau=0.5),
}


@pytest.mark.parametrize("name", list(MAKERS))
def test_left_padded_equals_rows_alone(name):
    make = MAKERS[name]
    dec = make(B)
    dec.append(K[:, :, :10], V[:, :, :10], key_mask=MASK[:, :10])  # a prefill, then tokens
    padded = [dec.query(Q[:, :, 9:10])]
    for i in range(10, N):
        dec.append(K[:, :, i:i + 1], V[:, :, i:i + 1], key_mask=MASK[:, i:i + 1])
        padded.append(dec.query(Q[:, :, i:i + 1]))
    padded = np.concatenate(padded, axis=2)
    assert dec.position == N
    for b, p in enumerate(PADS):
        row = make(1)
        if 10 - p > 0:
            row.append(K[b:b + 1, :, p:10], V[b:b + 1, :, p:10])
        alone = [row.query(Q[b:b + 1, :, 9:10])]
        for i in range(10, N):
            row.append(K[b:b + 1, :, i:i + 1], V[b:b + 1, :, i:i + 1])
            alone.append(row.query(Q[b:b + 1, :, i:i + 1]))
        np.testing.assert_array_equal(padded[b:b + 1], np.concatenate(alone, axis=2))
    if name.startswith("favor"):
        assert list(dec.state()["row_positions"]) == [N - p for p in PADS]


def test_mask_shape_names_the_argument():
    dec = MAKERS["favor"](B)
    with pytest.raises(_core.Error, match=r"key_mask: shape \[3,2\] must be \[3,4\] \(B, Nk\)"):
        dec.append(K[:, :, :4], V[:, :, :4], key_mask=MASK[:, :2])
    assert dec.position == 0


@pytest.mark.parametrize("name", list(MAKERS))
def test_prefill_and_step_equal_append_and_query(name):
    """Decoder / VQDecoder.prefill (causal attention from the state, leaving append's state)
    and .step (append then query in one fused pass) through the binding, left-padded rows
    at different positions, against the two calls token by token. Equal to float rounding
    (the projections' and the chunked sums' order): 1e-5 relative, as the C++ tests."""
    make = MAKERS[name]
    fused, split = make(B), make(B)
    y = [fused.prefill(Q[:, :, :10], K[:, :, :10], V[:, :, :10], key_mask=MASK[:, :10])]
    for i in range(10, N):
        y.append(fused.step(Q[:, :, i:i + 1], K[:, :, i:i + 1], V[:, :, i:i + 1],
                            key_mask=MASK[:, i:i + 1]))
    ref = []
    for i in range(N):
        split.append(K[:, :, i:i + 1], V[:, :, i:i + 1], key_mask=MASK[:, i:i + 1])
        ref.append(split.query(Q[:, :, i:i + 1]))
    y, ref = np.concatenate(y, axis=2), np.concatenate(ref, axis=2)
    assert np.linalg.norm(y - ref) <= 1e-5 * np.linalg.norm(ref)
    assert fused.position == N
    if name.startswith("favor"):
        assert list(fused.state()["row_positions"]) == [N - p for p in PADS]
    with pytest.raises(_core.Error, match=r"a step takes one token per row \(T = 1\)"):
        fused.step(Q[:, :, :2], K[:, :, :2], V[:, :, :2])


def test_torch_decoder_step_and_decode_step_op():
    """favor.torch.Decoder.step / prefill and favor.ops.decode_step (T = 1: the fused step) on
    CPU tensors equal the numpy decoder's calls bit for bit (the same C++ calls)."""
    import torch

    import favor.torch as ft
    from favor.ops import decode_step, empty_state
    q, k, v = (torch.from_numpy(a) for a in (Q, K, V))
    dec = ft.Decoder(B, H, DV, W)
    ref = MAKERS["favor"](B)
    mask = torch.from_numpy(MASK)
    np.testing.assert_array_equal(
        dec.prefill(q[:, :, :10], k[:, :, :10], v[:, :, :10], key_mask=mask[:, :10]).numpy(),
        ref.prefill(Q[:, :, :10], K[:, :, :10], V[:, :, :10], key_mask=MASK[:, :10]))
    state = tuple(torch.from_numpy(np.asarray(ref.state()[n])) for n in
                  ("sums", "log_max", "row_positions")) + (torch.tensor([10]),)
    w = torch.tensor(np.asarray(W.matrix))
    for i in range(10, N):
        s = slice(i, i + 1)
        want = ref.step(Q[:, :, s], K[:, :, s], V[:, :, s], key_mask=MASK[:, s])
        np.testing.assert_array_equal(
            dec.step(q[:, :, s], k[:, :, s], v[:, :, s], key_mask=mask[:, s]).numpy(), want)
        y, state = decode_step(state, q[:, :, s], k[:, :, s], v[:, :, s], w, key_mask=mask[:, s])
        np.testing.assert_array_equal(y.numpy(), want)
    assert empty_state(B, H, DV, M)[0].shape == (B, H, M, DV + 1)
