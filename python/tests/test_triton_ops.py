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
