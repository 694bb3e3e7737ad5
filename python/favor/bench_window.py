"""favor.bench's window section: method='window' (exact softmax on each query's last w = 64
keys and the first s = 4, the estimator removed: StreamingLLM's attention, the baseline of
every hybrid) through favor::exact_attention's CPU kernel (C++'s band kernel,
ExactOptions::window) against the same op's torch kernel (backend='torch': the torch band,
favor/ops/hybrid/chunk.py), forward (no grad) and forward + backward, in one run;
ratios torch / C++. Cost model: per (query, window or sink key) pair 2 D + 2 (Dv + 1) flops
forward, three times that with the backward (bench/cost_model.hpp's exact rule on the
band's pairs)."""
import torch

import favor.torch as ftorch

from . import bench_helpers as bh

WINDOW, SINKS = 64, 4
BACKENDS = (("cpp", None), ("torch_band", "torch"))


def _pairs(n, causal):
    """Keys each query scores: its window (causal min(i + 1, w); bidirectional the keys with
    |i - j| < w) plus the sinks outside it, summed over the queries of one head."""
    total = 0
    for i in range(n):
        win = min(i + 1, WINDOW) if causal else min(n, i + WINDOW) - max(0, i - WINDOW + 1)
        outside = max(0, i + 1 - WINDOW) if causal else max(0, n - win)
        total += win + min(SINKS, outside)
    return total


def window_rows(args, n, causal, log, batch, heads, dim):
    """Rows of one (N, mask): each backend's forward and forward + backward seconds."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=g) * 0.5 for _ in range(3))
    dy = torch.randn(batch, heads, n, dim, generator=g)
    flops = batch * heads * _pairs(n, causal) * (2 * dim + 2 * (dim + 1))
    rows, seconds = [], {}
    for name, backend in BACKENDS:
        def fwd():
            with torch.no_grad():
                return ftorch.attention(q, k, v, causal=causal, method="window", window=WINDOW,
                                        sinks=SINKS, backend=backend)

        def fwd_bwd():
            ts = [t.clone().requires_grad_() for t in (q, k, v)]
            y = ftorch.attention(*ts, causal=causal, method="window", window=WINDOW,
                                 sinks=SINKS, backend=backend)
            torch.autograd.grad((y * dy).sum(), ts)

        for pas, fn, f in (("fwd", fwd, flops), ("fwd+bwd", fwd_bwd, 3 * flops)):
            s, times = bh.median_seconds(fn, args.repeats)
            seconds[(name, pas)] = s
            rows.append(dict(section="window", impl=name, pass_=pas, causal=causal, n=n,
                             window=WINDOW, sinks=SINKS, seconds=s, times=times,
                             gflop_per_s=f / s / 1e9, tokens_per_s=batch * heads * n / s))
    for r in rows:
        r["pass"] = r.pop("pass_")
        if r["impl"] == "cpp":
            r["speedup_vs_torch_band"] = seconds[("torch_band", r["pass"])] / r["seconds"]
    log(f"window {'causal' if causal else 'bidir'} N={n}: " + ", ".join(
        f"{name} {pas} {bh.fmt_ms(seconds[(name, pas)])} ms" for name, _ in BACKENDS
        for pas in ("fwd", "fwd+bwd")))
    return rows


def tables(records):
    win = [r for r in records if r["section"] == "window"]
    idx = {(r["impl"], r["pass"], r["causal"], r["n"]): r for r in win}
    rows = []
    for causal, pas, n in sorted({(r["causal"], r["pass"], r["n"]) for r in win}):
        c, t = idx[("cpp", pas, causal, n)], idx[("torch_band", pas, causal, n)]
        rows.append(["causal" if causal else "bidir", pas, n, bh.fmt_ms(c["seconds"]),
                     bh.fmt_ms(t["seconds"]), f"{c['gflop_per_s']:.1f}",
                     f"{t['gflop_per_s']:.1f}", bh.fmt_ratio(c["speedup_vs_torch_band"])])
    return rows and bh.markdown(
        ["mask", "pass", "N", f"C++ band ms (w {WINDOW}, s {SINKS})", "torch band ms",
         "C++ GFLOP/s", "torch GFLOP/s", "C++ speed-up"], rows)
