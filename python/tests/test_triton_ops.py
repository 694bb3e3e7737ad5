"""favor.torch's 'triton' path end to end, in Triton's interpreter on CPU tensors: half inputs,
the modules and favor::decode_step against the C++ kernels, what the path refuses. (Every op's
kernels against the float64 oracle, forward and gradients, triton included:
test_conformance.py; the kernels' own tests: test_triton_forward.py, test_triton_backward.py.)

Tolerance: both sides are float32 evaluations of one formula with the same stabiliser, so
they agree to a few float32 roundings of the result (N + F terms of <= 1 each: ~(N + F)
2^-24 ~ 1e-5 worst case, docs/numerics.md rule 4); gradients to 1e-5 relative likewise.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import pytest  # noqa: E402
import torch  # noqa: E402

import favor  # noqa: E402
import favor.torch as ft  # noqa: E402
from favor.ops import decode_step, empty_state  # noqa: E402
from torch_helpers import frob, seeded_qkv  # noqa: E402

torch.set_num_threads(1)


def test_half_inputs_reach_the_kernels():
    """float16 q, k, v go to the kernels as they are: the output is the float32 call on the
    rounded inputs, in float16, and gradients come back in float16."""
    q, k, v = (t.half() for t in seeded_qkv(1, 2, 20, 16, 4, 3))
    y = ft.attention(q, k, v, causal=True, backend="triton")
    assert y.dtype == torch.float16
    ref = ft.attention(q.float(), k.float(), v.float(), causal=True, backend="triton")
    assert torch.equal(y, ref.half())
    mixed = ft.attention(q, k.double(), v, causal=True, backend="triton")  # not all half:
    assert mixed.dtype == torch.float16                                  # float32 copies
    qq = q.clone().requires_grad_()
    (gq,) = torch.autograd.grad(ft.attention(qq, k, v, backend="triton").float().sum(), qq)
    assert gq.dtype == torch.float16 and torch.isfinite(gq).all()


def test_modules_and_the_fused_decode_step():
    torch.manual_seed(0)
    layer = ft.FavorAttention(32, 2, causal=True, features=16, kernel="hedgehog",
                              learn_features=True, decay=[0.9, 0.8], backend="triton")
    x = torch.randn(2, 11, 32)
    y = layer(x)
    layer.core.backend = None
    assert frob(y, layer(x)) < 1e-5
    # favor::decode_step: the fused append + query kernel, on the C++ decoder's state
    b, h, d, dv, m = 2, 2, 16, 4, 16
    q, k, v = seeded_qkv(b, h, 7, d, dv, 4)
    w = torch.tensor(favor.make_projection(d, "orthogonal", features=m, seed=0).matrix)
    keep = torch.ones(b, 7, dtype=torch.bool)
    keep[1, :2] = False
    s_cpp = s_tri = empty_state(b, h, dv, m)
    for t in range(7):
        sl = slice(t, t + 1)
        args = (q[:, :, sl], k[:, :, sl], v[:, :, sl], w)
        kw = dict(key_mask=keep[:, sl], decay=torch.tensor([0.95]))
        y_cpp, s_cpp = decode_step(s_cpp, *args, **kw)
        y_tri, s_tri = decode_step(s_tri, *args, backend="triton", **kw)
        assert frob(y_tri, y_cpp) < 1e-5 or float(y_cpp.norm()) == 0 == float(y_tri.norm())
    assert frob(s_tri[0], s_cpp[0]) < 1e-5
    assert torch.equal(s_tri[2], s_cpp[2]) and torch.equal(s_tri[3], s_cpp[3])


def test_the_fused_hybrid_decode_step(monkeypatch):
    """favor::hybrid_decode_step's Triton kernel (one fused push + query per head, the state in
    place) token by token, with blocks small enough that every loop makes two trips or more:
    a window of 4 in ring blocks of 2 (the ring wraps twice), Dv = 6 in value tiles of 4 (the
    normaliser column written after its last read), F = 32 in feature tiles of 16; 2 sinks,
    2 batch rows x 2 heads (each row's bookkeeping written by its last program), left
    padding, a hole and decay through a learned map. Rows within the conformance bound of
    the float64 oracle (test_conformance.py runs the default blocks); the ring, sinks, clocks
    and position equal to the C++ decoder's; sums and log_max within the bound. The torch
    kernel must not run (a fallback would pass the same checks)."""
    import functools
    import importlib

    from favor import _core
    from favor.ops.hybrid import empty_hybrid_state, hybrid_advance
    from favor.ops.hybrid import naive as hybrid_naive
    from favor.ops.hybrid import op as hybrid_op

    kernels = importlib.import_module("favor.ops.hybrid.triton")
    b, h, n, d, dv, m, window, sinks = 2, 2, 10, 16, 6, 16, 4, 2
    q, k, v = seeded_qkv(b, h, n, d, dv, 8)
    g = torch.Generator().manual_seed(9)
    maps = dict(weights=torch.randn(h, m, d, generator=g) * 0.3,
                bias=torch.randn(h, m, generator=g) * 0.1,
                feature_weights=torch.rand(h, m, generator=g) + 0.5,
                decay=torch.tensor([0.9, 0.97], dtype=torch.float64))
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[1, :2] = False                      # left padding
    keep[0, 5] = False                       # a hole
    w = torch.randn(m, d, generator=g)
    kw = dict(kernel="hedgehog", window=window, sinks=sinks, **maps)
    features = _core.feature_count("hedgehog", m)
    states, ys = {}, {}
    for backend in ("cpu", "triton"):
        if backend == "triton":
            def refuse(*args):
                raise AssertionError("the torch kernel ran instead of the fused one")
            monkeypatch.setattr(hybrid_op, "torch_hybrid", refuse)
            monkeypatch.setattr(kernels, "hybrid_decode_step", functools.partial(
                kernels.hybrid_decode_step, block_w=2, block_dv=4, block_f=16))
        st = empty_hybrid_state(b, h, dv, features, d, window, sinks)
        ys[backend] = torch.cat([hybrid_advance(
            st, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], w, mode="step",
            key_mask=keep[:, i:i + 1], backend=None if backend == "cpu" else backend, **kw)
            for i in range(n)], 2)
        states[backend] = st
    y_ref = hybrid_naive.hybrid_attention(
        *(t.double() for t in (q, k, v)), maps["weights"].double(), "hedgehog", True, keep=keep,
        bias=maps["bias"].double(), lam=maps["feature_weights"].double(), decay=maps["decay"],
        window=window, sinks=sinks)
    visible = keep[:, None, :, None].expand(b, h, n, dv)
    bound = 4 * (n + features + window + sinks + d) * 2.0 ** -24
    assert frob(ys["triton"] * visible, y_ref * visible) < bound
    cpp, tri = states["cpu"], states["triton"]
    for name in ("row_positions", "position", "ring_k", "ring_v", "ring_keep", "ring_sink",
                 "sink_k", "sink_v", "sink_pos"):
        assert torch.equal(getattr(tri, name), getattr(cpp, name)), name
    assert frob(tri.sums.double(), cpp.sums.double()) < bound
    assert frob(tri.log_max, cpp.log_max) < bound
    flat = [t[:, :, :1].reshape(b * h, -1).contiguous() for t in (q, k, v)]
    with pytest.raises(ValueError, match="block_w: 3 must be a power of two"):
        kernels.hybrid_decode_step(tri, *flat, w[None], None, None, None, 0.0, 1, 0.0, None, h,
                                   scale=0.25, window=window, sinks=sinks, block_w=3)


def test_a_hybrid_prompt_on_the_triton_kernel_runs_the_fused_band(monkeypatch):
    """favor::hybrid_decode_step's Triton kernel: a prompt on an empty state ('prefill') is
    favor::attention's Triton forward (the band fused, not the torch band's blocks), bit for
    bit, and leaves the torch kernel's state."""
    from favor.ops.hybrid import chunk, empty_hybrid_state, hybrid_advance
    from favor import _core
    b, h, n, d, dv, m, window, sinks = 1, 2, 23, 16, 8, 16, 5, 2
    q, k, v = seeded_qkv(b, h, n, d, dv, 4)
    w = torch.randn(m, d, generator=torch.Generator().manual_seed(5))
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, :3] = False
    f = _core.feature_count("positive", m)
    kw = dict(window=window, sinks=sinks, mode="prefill", key_mask=keep)
    torch_state = empty_hybrid_state(b, h, dv, f, d, window, sinks)
    hybrid_advance(torch_state, q, k, v, w, backend="torch", **kw)
    want = ft.attention(q, k, v, projection=w, causal=True, window=window, sinks=sinks,
                        key_padding_mask=~keep, backend="triton")

    def refuse(*args, **kwargs):
        raise AssertionError("the torch band ran")
    monkeypatch.setattr(chunk, "_band", refuse)
    state = empty_hybrid_state(b, h, dv, f, d, window, sinks)
    y = hybrid_advance(state, q, k, v, w, backend="triton", **kw)
    assert torch.equal(y, want)
    for name, a, t in zip(state._fields, state, torch_state):
        assert torch.equal(a, t), name


def test_what_the_triton_path_refuses():
    q, k, v = seeded_qkv(1, 1, 8, 20, 4, 5)              # D = 20: not a fused head dim
    with pytest.raises(favor.Error, match="backend: 'triton' takes head dims"):
        ft.attention(q, k, v, backend="triton")
    y = ft.attention(q, k, v)                              # CPU tensors: the C++ kernels
    assert torch.isfinite(y).all()
    with pytest.raises(favor.Error, match="'triton' needs the triton package and a CUDA device"):
        os.environ["TRITON_INTERPRET"] = "0"
        try:
            ft.attention(q, k, v, backend="triton")
        finally:
            os.environ["TRITON_INTERPRET"] = "1"


def test_gpu_benchmark_harness_runs(tmp_path):
    """python -m favor.bench_gpu --quick: the harness of the GPU benchmark (docs/gpu.md) on
    tiny shapes in the interpreter (a check that it runs and writes its files; no timing
    is asserted)."""
    from favor import bench_gpu
    result = bench_gpu.main(["--quick", "--out", str(tmp_path)])
    impls = {r["impl"] for r in result["records"]}
    assert {"favor_triton", "favor_torch"} <= impls
    assert len(result["records"]) == 8                 # 2 impls x causal/not x fwd/fwd+bwd
    assert all(r["ms"] > 0 for r in result["records"])
    assert {p.name for p in tmp_path.iterdir()} == {"results.json", "table.md", "autotune.md"}
