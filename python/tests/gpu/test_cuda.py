"""favor on a CUDA device (docs/gpu.md): run where a GPU is lent (scripts/gpu-check.sh), not
in CI (this folder is outside CTest's glob, and every test skips without CUDA).

Oracles: the C++ kernels on the CPU copies of the same tensors (float32) and favor's torch
path on the device. Bounds: exact fp32 dots (torch's default, allow_tf32 False) meet the
CPU's float32 result to 1e-5 relative (docs/numerics.md rule 4: two float32 evaluations of
one formula); tf32 dots carry 2^-11 relative error into exponents of size |a| <= ~4 here:
~2e-3 per feature, bound 1e-2; bf16 inputs: the float32 call on the rounded inputs, to the
bf16 rounding of the output (2^-8) with the fp32 arithmetic's own error: bound 1e-2.
"""
import pytest
import torch

import favor
import favor.torch as ft
from favor.ops import decode_step, empty_state
from torch_helpers import frob, seeded_qkv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("kernel,causal,learned", [
    ("positive", False, False), ("positive", True, False), ("hyperbolic", True, False),
    ("trig", False, False), ("hedgehog", True, True), ("favorpp", True, False)])
@pytest.mark.parametrize("n", [1, 65, 4096])
def test_forward_and_gradients_match_the_cpu(backend, kernel, causal, learned, n):
    b, h, d, dv, m = 2, 4, 64, 64, 128
    q, k, v = seeded_qkv(b, h, n, d, dv, n, 0.6)
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[1, : n // 3] = True
    g = torch.Generator().manual_seed(1)
    extra = {}
    if learned:
        extra = dict(weights=torch.randn(h, m, d, generator=g) * 0.2,
                     bias=torch.randn(h, m, generator=g) * 0.1,
                     feature_weights=torch.rand(h, m, generator=g) + 0.5,
                     decay=torch.tensor([0.9, 0.95, 0.99, 1.0], dtype=torch.float64))
    fit = 0.05 if kernel == "favorpp" else None
    leaves = [q, k, v, *extra.values()]
    dy = torch.randn(b, h, n, dv, generator=g)

    def run(device, backend):
        xs = [t.to(device).requires_grad_() for t in leaves]
        y = ft.attention(*xs[:3], kernel=kernel, causal=causal, features=m, fit=fit,
                         key_padding_mask=mask.to(device), backend=backend,
                         **dict(zip(extra, xs[3:])))
        return y, torch.autograd.grad(y, xs, dy.to(device))
    y_gpu, g_gpu = run(CUDA, backend)
    y_cpu, g_cpu = run("cpu", None)
    assert frob(y_gpu, y_cpu) < 1e-5
    for a, c in zip(g_gpu, g_cpu):
        assert frob(a, c) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
def test_tf32_bf16_and_long_sequences(causal):
    n = 32768
    q, k, v = (t.to(CUDA) for t in seeded_qkv(1, 8, n, 64, 64, 7, 0.6))
    ref = ft.attention(q, k, v, causal=causal, backend="torch")
    y = ft.attention(q, k, v, causal=causal, backend="triton")
    assert torch.isfinite(y).all() and frob(y, ref) < 1e-5
    torch.backends.cuda.matmul.allow_tf32 = True
    assert frob(ft.attention(q, k, v, causal=causal, backend="triton"), ref) < 1e-2
    torch.backends.cuda.matmul.allow_tf32 = False
    lo = [t.bfloat16() for t in (q, k, v)]
    y16 = ft.attention(*lo, causal=causal, backend="triton")
    assert y16.dtype == torch.bfloat16
    assert frob(y16, ft.attention(*[t.float() for t in lo], causal=causal)) < 1e-2


def test_large_norms_stay_finite():
    q, k, v = (t.to(CUDA) for t in seeded_qkv(1, 2, 300, 64, 64, 3, 0.6))
    big = [t / t.norm(dim=-1, keepdim=True) * 1e3 for t in (q, k)]
    for causal in (False, True):
        for kernel in ("positive", "hyperbolic", "trig"):
            assert torch.isfinite(ft.attention(*big, v, kernel=kernel, causal=causal)).all()


def test_decode_step_and_decoder_on_the_device():
    b, h, d, dv, m = 2, 4, 64, 64, 128
    q, k, v = seeded_qkv(b, h, 40, d, dv, 5, 0.6)
    w = torch.tensor(favor.make_projection(d, "orthogonal", features=m, seed=0).matrix)
    s_cpu, s_gpu = empty_state(b, h, dv, m), empty_state(b, h, dv, m, device=CUDA)
    for t in range(40):
        sl = slice(t, t + 1)
        y_c, s_cpu = decode_step(s_cpu, q[:, :, sl], k[:, :, sl], v[:, :, sl], w,
                                 decay=torch.tensor([0.97]))
        y_g, s_gpu = decode_step(s_gpu, *(x[:, :, sl].to(CUDA) for x in (q, k, v)), w.to(CUDA),
                                 decay=torch.tensor([0.97]))
        assert frob(y_g, y_c) < 1e-5
    layer = ft.FavorAttention(256, 4, causal=True, features=m).to(CUDA).eval()
    x = torch.randn(2, 30, 256, device=CUDA)
    with torch.no_grad():
        full = layer(x)
        dec = layer.decoder(2)
        steps = torch.cat([layer.step(x[:, t:t + 1], dec) for t in range(30)], 1)
    assert frob(steps, full) < 1e-5 and dec.state()["sums"].device.type == "cuda"


def test_hybrid_decode_step_on_the_device():
    """The fused Triton hybrid step (window 64 over 150 tokens: the ring wraps; 4 sinks;
    left padding and a hole; decay) against the C++ hybrid decoder on the CPU copies: rows
    to 1e-5, the ring, sinks, clocks and position equal, the state on the device."""
    from favor import _core
    from favor.ops.hybrid import empty_hybrid_state, hybrid_advance
    b, h, n, d, dv, m, window, sinks = 3, 4, 150, 64, 64, 128, 64, 4
    q, k, v = seeded_qkv(b, h, n, d, dv, 6, 0.6)
    w = torch.tensor(favor.make_projection(d, "orthogonal", features=m, seed=0).matrix)
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[2, :7] = False
    keep[0, 90] = False
    f = _core.feature_count("positive", m)
    kw = dict(window=window, sinks=sinks, decay=torch.tensor([0.99]))
    s_cpu = empty_hybrid_state(b, h, dv, f, d, window, sinks)
    s_gpu = empty_hybrid_state(b, h, dv, f, d, window, sinks, device=CUDA)
    for t in range(n):
        sl = slice(t, t + 1)
        y_c = hybrid_advance(s_cpu, q[:, :, sl], k[:, :, sl], v[:, :, sl], w,
                             key_mask=keep[:, sl], **kw)
        y_g = hybrid_advance(s_gpu, *(x[:, :, sl].to(CUDA) for x in (q, k, v)), w.to(CUDA),
                             key_mask=keep[:, sl].to(CUDA), **kw)
        assert frob(y_g.cpu(), y_c) < 1e-5, t
    for name in ("row_positions", "position", "ring_k", "ring_v", "ring_keep", "ring_sink",
                 "sink_k", "sink_v", "sink_pos"):
        assert torch.equal(getattr(s_gpu, name).cpu(), getattr(s_cpu, name)), name
    assert frob(s_gpu.sums.cpu(), s_cpu.sums) < 1e-5
    assert frob(s_gpu.log_max.cpu(), s_cpu.log_max) < 1e-5


def test_vq_and_training_steps_on_the_device():
    torch.manual_seed(0)
    cpu = ft.VQAttention(128, 4, 32, causal=True)
    gpu = ft.VQAttention(128, 4, 32, causal=True).to(CUDA)
    gpu.load_state_dict(cpu.state_dict())
    x = torch.randn(2, 64, 128)
    for layer, xx in ((cpu, x), (gpu, x.to(CUDA))):
        layer.train()
        layer(xx).square().mean().backward()
    assert frob(gpu.core.codebook, cpu.core.codebook) < 1e-5
    assert frob(gpu.out_proj.weight.grad, cpu.out_proj.weight.grad) < 1e-4
    model = ft.FavorAttention(128, 4, causal=True, features=64, kernel="hedgehog",
                              learn_features=True, decay=0.99, learn_decay=True).to(CUDA)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 128, 128, device=CUDA)).square().mean().backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
