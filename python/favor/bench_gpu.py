"""favor's GPU benchmark (docs/gpu.md): python -m favor.bench_gpu [--quick] [--out DIR].

On a CUDA device, [B*H, N, D] problems with B*H = 32 (default), D in {64, 128}, F = m in
{128, 256, 512}, N = 1k..32k, causal and not, forward and forward+backward, bf16 inputs:
- favor_triton: favor.torch.attention(backend='triton') (the fused kernels);
- favor_torch: backend='torch' (plain torch operations);
- sdpa_flash, sdpa_cudnn: torch's scaled_dot_product_attention with one backend forced
  (torch.nn.attention.sdpa_kernel), the exact attention a torch user has;
- fla_chunk: fla's chunk_linear_attn on FAVOR+ features materialised by torch operations
  (favor.torch.plain's favor_plus_features; the feature map's time included), when fla
  imports.
Times are triton.testing.do_bench medians (warm-up first: every shape compiles and tunes
before it is timed); rates are the cost model's flops (favor.bench_helpers: favor_flops,
softmax_flops; backward by the same model) over the time. The decode step (B*H heads, one
token, F x (Dv + 1) state) is reported as achieved bandwidth: the state read and written
(8 F (Dv + 1) bytes per head) plus q, k, v over the time; the hybrid decode step (window
64, 4 sinks) as its time and its tokens/s against the plain step's. The autotuner's winners are
written with the table. Seeds fixed (printed).

Without a GPU (--quick under TRITON_INTERPRET=1, CPU tensors) the same harness runs tiny
shapes with a wall-clock timer: a check that it works, not a measurement.
"""
import argparse
import json
import os
import sys
import time

import torch

from . import bench_helpers as bh
from .ops.attention.naive import favor_plus_features

SEED = 0


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m favor.bench_gpu", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384,
                                                               32768])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--features", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--bh", type=int, default=32, help="batch x heads")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--impls", nargs="+", default=["favor_triton", "favor_torch", "sdpa_flash",
                                                  "sdpa_cudnn", "fla_chunk"])
    p.add_argument("--out", default="bench_gpu_results", help="folder for results.json, "
                   "table.md and autotune.md")
    p.add_argument("--quick", action="store_true", help="tiny shapes (a check of the harness)")
    a = p.parse_args(argv)
    if a.quick:
        a.lengths, a.dims, a.features, a.bh = [64], [16], [16], 2
        a.dtype = "float32" if not torch.cuda.is_available() else a.dtype
    return a


def timer(device):
    """ms per call: triton.testing.do_bench on CUDA, a wall-clock median elsewhere."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return lambda fn: do_bench(fn, warmup=25, rep=100)

    def wall(fn):
        fn()
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return 1e3 * sorted(times)[1]
    return wall


def make_impl(name, q, k, v, w, causal):
    """A closure computing one forward (output returned), or None where unavailable."""
    import favor.torch as ft
    q4, k4, v4 = (t.unsqueeze(0) for t in (q, k, v))
    if name in ("favor_triton", "favor_torch"):
        backend = name.split("_")[1]
        return lambda: ft.attention(q4, k4, v4, projection=w, causal=causal, backend=backend)
    if name.startswith("sdpa"):
        if q.device.type != "cuda":
            return None
        from torch.nn.attention import SDPBackend, sdpa_kernel
        which = SDPBackend.FLASH_ATTENTION if name == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION

        def sdpa():
            with sdpa_kernel(which):
                return torch.nn.functional.scaled_dot_product_attention(q4, k4, v4,
                                                                        is_causal=causal)
        return sdpa
    if name == "fla_chunk":
        try:
            from fla.ops.linear_attn import chunk_linear_attn
        except ImportError:
            return None
        if not causal:
            return None  # fla's chunk kernel is causal

        def fla():  # fla's layout [B, T, H, K]: the B*H heads as H of one sequence
            pq, pk = (t.to(q.dtype) for t in favor_plus_features(q.float(), k.float(), w))
            bt = lambda t: t.transpose(0, 1).unsqueeze(0)  # noqa: E731
            o = chunk_linear_attn(bt(pq), bt(pk), bt(v), scale=1.0, normalize=True)
            return (o[0] if isinstance(o, tuple) else o)[0].transpose(0, 1)
        return fla
    raise SystemExit(f"--impls: unknown '{name}'")


def with_backward(fn, leaves):
    """forward + backward of (y * g).sum() with a fixed g."""
    g = {}

    def run():
        for t in leaves:
            t.grad = None
        y = fn()
        if "g" not in g:
            g["g"] = torch.randn_like(y)
        (y * g["g"]).sum().backward()
    return run


def cost(name, p, causal, backward):
    """The cost model's flops of one call (favor's chunk C = 64)."""
    if name.startswith("sdpa"):
        f = bh.softmax_flops(p, causal)
        return f + (bh.softmax_backward_flops(p, causal) if backward else 0.0)
    f = bh.favor_flops(p, causal, 64)
    return f + (bh.favor_backward_flops(p, causal, 64, False) if backward else 0.0)


def decode_rate(device, dtype, heads, d, dv, m, measure):
    """(ms, GB/s) of favor's fused decode step on heads [1, heads, 1, D] tokens: the kernel
    itself (triton_decode_step on the canonical map, without the eager checks of
    favor.ops.decode_step, which read values on the host) on CUDA; decode_step elsewhere."""
    from .ops import decode_step, empty_state
    from .ops.attention.canonical import canonical_map
    g = torch.Generator(device="cpu").manual_seed(SEED)
    q, k, v = (torch.randn(1, heads, 1, x, generator=g).to(device, dtype) for x in (d, d, dv))
    w = torch.randn(m, d, generator=g).to(device)
    state = empty_state(1, heads, dv, m, device=device)
    if device.type == "cuda":
        from .ops.attention.triton_function import triton_decode_step
        cm = canonical_map(w, None, None, None, None, None, None, "positive", None, d)
        ms = measure(lambda: triton_decode_step(state, q, k, v, cm, None))
    else:
        ms = measure(lambda: decode_step(state, q, k, v, w))
    moved = heads * (8.0 * m * (dv + 1) + 16 + (2 * d + dv) * q.element_size())
    return ms, moved / (ms * 1e-3) / 1e9


def hybrid_decode_rate(device, dtype, heads, d, dv, m, measure, window=64, sinks=4):
    """ms of favor's fused hybrid decode step (window 64, 4 sinks: issue 49's sizes) on heads
    [1, heads, 1, D] tokens, the state first advanced past the window so that every timed
    step folds a token into the linear state: the kernel itself (triton_hybrid_step, the
    state advanced in place, without the op's eager checks) on CUDA; hybrid_advance
    elsewhere."""
    from . import _core
    from .ops.hybrid import empty_hybrid_state, hybrid_advance
    from .ops.hybrid.chunk import pair_log_const
    g = torch.Generator(device="cpu").manual_seed(SEED)
    q, k, v = (torch.randn(1, heads, 1, x, generator=g).to(device, dtype) for x in (d, d, dv))
    w = torch.randn(m, d, generator=g).to(device)
    state = empty_hybrid_state(1, heads, dv, _core.feature_count("positive", m), d, window,
                               sinks, device=device)
    prompt = [torch.randn(1, heads, window + 1, x, generator=g).to(device) for x in (d, d, dv)]
    hybrid_advance(state, *prompt, w, window=window, sinks=sinks, mode="prefill")
    if device.type == "cuda":
        from .ops.attention.canonical import canonical_map
        from .ops.attention.triton_function import triton_hybrid_step
        cm = canonical_map(w, None, None, None, None, None, None, "positive", None, d)
        lc = pair_log_const("positive", m)
        qf, kf, vf = q.float(), k.float(), v.float()
        return measure(lambda: triton_hybrid_step(state, qf, kf, vf, cm, None, d ** -0.5,
                                                  window, sinks, lc, True))
    return measure(lambda: hybrid_advance(state, q, k, v, w, window=window, sinks=sinks))


def autotune_winners():
    """{kernel: {key: config}} of the fused kernels' autotuners (empty in the interpreter)."""
    from .ops.attention.triton import attend, decode
    from .ops.hybrid.triton import decode as hybrid_decode
    out = {}
    for mod in (attend, decode, hybrid_decode):
        for name, obj in vars(mod).items():
            cache = getattr(obj, "cache", None)
            if isinstance(cache, dict) and cache and hasattr(obj, "configs"):
                out[f"{mod.__name__.rsplit('.', 1)[1]}.{name}"] = {
                    str(k): str(c) for k, c in cache.items()}
    return out


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    torch.manual_seed(SEED)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        a.impls = [i for i in a.impls if i != "favor_triton"]
    dtype = getattr(torch, a.dtype)
    measure = timer(device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    print(f"favor.bench_gpu: {name}, torch {torch.__version__}, seed {SEED}, B*H = {a.bh}, "
          f"{a.dtype}", flush=True)
    records = []
    g = torch.Generator(device="cpu").manual_seed(SEED)
    for d in a.dims:
        for n in a.lengths:
            q, k, v = (torch.randn(a.bh, n, d, generator=g).to(device, dtype) * s
                       for s in (0.5, 0.5, 1.0))
            for m in a.features:
                w = torch.randn(m, d, generator=g).to(device)
                p = bh.Problem(a.bh, n, d, d, m, m)
                for causal in (False, True):
                    for impl in a.impls:
                        for backward in (False, True):
                            leaves = [t.clone().requires_grad_(backward) for t in (q, k, v)]
                            fn = make_impl(impl, *leaves, w, causal)
                            if fn is None or (impl.startswith("sdpa") and m != a.features[0]):
                                continue
                            run = with_backward(fn, leaves) if backward else fn
                            try:
                                with torch.no_grad() if not backward else torch.enable_grad():
                                    ms = measure(run)
                            except Exception as e:  # a backend that refuses a shape
                                print(f"  {impl} N={n} D={d} F={m}: {type(e).__name__}: {e}",
                                      flush=True)
                                continue
                            rec = dict(impl=impl, n=n, d=d, f=m, causal=causal,
                                       backward=backward, ms=ms,
                                       tflops=cost(impl, p, causal, backward) / (ms * 1e-3) / 1e12)
                            records.append(rec)
                            print(f"  {impl:13s} D={d:3d} F={m:3d} N={n:6d} "
                                  f"{'causal' if causal else 'bidir ':6s} "
                                  f"{'fwd+bwd' if backward else 'fwd    '} {ms:9.3f} ms "
                                  f"{rec['tflops']:7.2f} TFLOP/s", flush=True)
    dec = decode_rate(device, dtype, a.bh, a.dims[0], a.dims[0], a.features[0], measure)
    print(f"  decode step: {dec[0]:.4f} ms, {dec[1]:.1f} GB/s", flush=True)
    hyb = hybrid_decode_rate(device, dtype, a.bh, a.dims[0], a.dims[0], a.features[0], measure)
    print(f"  hybrid decode step (w 64, s 4): {hyb:.4f} ms, {dec[0] / hyb:.2f}x the plain "
          "step's tokens/s", flush=True)
    os.makedirs(a.out, exist_ok=True)
    result = dict(device=name, torch=torch.__version__, seed=SEED, bh=a.bh, dtype=a.dtype,
                  records=records, decode=dict(ms=dec[0], gbps=dec[1]),
                  hybrid_decode=dict(ms=hyb, window=64, sinks=4, vs_plain=dec[0] / hyb),
                  autotune=autotune_winners())
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    rows = [[r["impl"], r["d"], r["f"], r["n"], "causal" if r["causal"] else "bidir",
             "fwd+bwd" if r["backward"] else "fwd", f"{r['ms']:.3f}", f"{r['tflops']:.1f}"]
            for r in records]
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(bh.markdown(["impl", "D", "F", "N", "mode", "pass", "ms", "TFLOP/s"], rows))
    with open(os.path.join(a.out, "autotune.md"), "w") as f:
        for kernel, wins in result["autotune"].items():
            f.write(f"- {kernel}: " + "; ".join(f"{k} -> {c}" for k, c in wins.items()) + "\n")
    print(f"favor.bench_gpu: wrote {a.out}/results.json, table.md, autotune.md")
    return result


if __name__ == "__main__":
    main()
