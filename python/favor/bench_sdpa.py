"""favor.bench's sections against what torch users have now (`--sections sdpa call`).

sdpa: torch.nn.functional.scaled_dot_product_attention (torch 2.x; on CPU it dispatches to
the fused flash-attention kernel, aten::_scaled_dot_product_flash_attention_for_cpu: the
backend is checked and recorded) against favor.torch.attention (FAVOR+ positive,
orthogonal, m = 256) and favor's own blockwise exact kernel (favor.torch.attention
method='exact', up to --exact-max-n), [B, H, N, D] = [2, 4, N, 64], forward under no_grad
and forward+backward (loss = (y * g).sum() with a fixed random g), causal and not. Then
favor's crossover with SDPA (log-log interpolation between sweep points) and the ratio
t_sdpa / t_favor at 4k and 16k.

call: the per-call time of favor.torch.attention on [1, H, N, 64] tensors (no_grad;
H = --call-heads, 8), N = 1..1024, against the C++ call: favor._core.time_attention (timed inside C++),
favor._core.attention (the pybind11 call) and favor.attention (numpy); SDPA on the same
tensors as torch's own floor. Medians over interleaved rounds.
"""
import sys

import numpy as np
import torch

import favor
import favor.torch as ftorch

from . import bench_helpers as bh

BATCH, HEADS, DIM, FEATURES = 2, 4, 64, 256
IMPLS = ("sdpa", "favor", "favor_exact")
RATIO_AT = (4096, 16384)
SDPA_NAME = "torch.nn.functional.scaled_dot_product_attention"


def add_arguments(p):
    p.add_argument("--sdpa-lengths", type=int, nargs="+",
                   default=[128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--exact-max-n", type=int, default=4096,
                   help="longest N of favor's exact kernel in the sdpa section (0: none)")
    p.add_argument("--point-seconds", type=float, default=2.0,
                   help="sdpa section: stop repeating a figure once its runs total this; a "
                   "warm-up longer than this is the only run")
    p.add_argument("--call-lengths", type=int, nargs="+",
                   default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    p.add_argument("--call-heads", type=int, default=8,
                   help="call section: heads H of the [1, H, N, 64] inputs")
    p.add_argument("--call-rounds", type=int, default=31,
                   help="call section: interleaved rounds (median)")


def finish_args(a):
    a.call_loop_s = 0.01
    a.has_sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    if not a.has_sdpa and "sdpa" in a.sections:  # torch < 2.0
        a.sections.remove("sdpa")
        print(f"favor.bench: torch {torch.__version__} has no scaled_dot_product_attention; "
              "section sdpa skipped", file=sys.stderr)
    if a.quick:
        a.sdpa_lengths, a.exact_max_n, a.point_seconds = [64, 128], 128, 0.05
        a.call_lengths, a.call_rounds, a.call_loop_s = [1, 8], 3, 0.002
    if (min(a.sdpa_lengths + a.call_lengths) < 1 or a.call_rounds < 1 or a.call_heads < 1
            or a.point_seconds <= 0):
        raise SystemExit("--sdpa-lengths, --call-lengths, --call-heads, --call-rounds and "
                         "--point-seconds must be positive")


def sdpa(q, k, v, causal):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_backend(q, k, v, causal):
    """The backend torch's dispatcher picks for these inputs (torch._fused_sdp_choice, a
    private function: None where this torch lacks it)."""
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is None:
        return None
    try:
        from torch.nn.attention import SDPBackend
        return SDPBackend(choice(q, k, v, None, 0.0, causal)).name
    except Exception:  # noqa: BLE001 (a private API: record that it could not say)
        return None


def sdpa_kernels(causal):
    """The aten operators the profiler sees in one SDPA forward and one forward+backward at
    a small size: which kernel actually ran."""
    from torch.profiler import ProfilerActivity, profile
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, DIM, generator=gen, requires_grad=True) for _ in range(3))
    out = {}
    for pas in ("fwd", "fwd+bwd"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            if pas == "fwd":
                with torch.no_grad():
                    sdpa(q, k, v, causal)
            else:
                sdpa(q, k, v, causal).sum().backward()
        out[pas] = sorted({e.name for e in prof.events()
                           if "attention" in e.name or "flash" in e.name})
    return out


def flops(prob, impl, causal, backward):
    """Cost model (bench_helpers): exact attention 4 N^2 D per head forward (half causal),
    twice that for the backward's products; favor from its cost model (bench/cost_model.hpp)."""
    if impl == "favor":
        chunk = favor.kernel_info()["causal_chunk"]
        f = bh.favor_flops(prob, causal, chunk)
        return f + (bh.favor_backward_flops(prob, causal, chunk, context=not causal)
                    if backward else 0.0)
    f = bh.softmax_flops(prob, causal)
    return f + (bh.softmax_backward_flops(prob, causal) if backward else 0.0)


def sdpa_rows(args, n, causal, log):
    """The records of the three implementations x (fwd, fwd+bwd) at one N and mask."""
    gen = torch.Generator().manual_seed(n)  # the inputs' seed is N
    q, k, v, g = (torch.randn(BATCH, HEADS, n, DIM, generator=gen) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    prob = bh.Problem(BATCH * HEADS, n, DIM, DIM, FEATURES, FEATURES)
    fns = {"sdpa": lambda *x: sdpa(*x, causal),
           "favor": lambda *x: ftorch.attention(*x, causal=causal, features=FEATURES),
           "favor_exact": lambda *x: ftorch.attention(*x, causal=causal, method="exact")}

    def runner(impl, backward):
        fn = fns[impl]
        if not backward:
            return lambda: fn(q, k, v)

        def step():
            for t in leaves:
                t.grad = None
            y = fn(*leaves)
            (y * g).sum().backward()
            return y.detach()
        return step

    rows, outputs = [], {}
    for pas in ("fwd", "fwd+bwd"):
        backward = pas == "fwd+bwd"
        for impl in IMPLS:
            if impl == "favor_exact" and n > args.exact_max_n:
                continue
            rec = dict(section="sdpa", impl=impl, causal=causal, n=n, b=BATCH, h=HEADS,
                       bh=prob.bh, d=DIM, dv=DIM, m=FEATURES if impl == "favor" else None,
                       seed=n, threads=torch.get_num_threads(), favor_threads=favor.num_threads())
            rec["pass"] = pas
            if impl == "sdpa":
                rec["backend"] = sdpa_backend(*(leaves if backward else (q, k, v)), causal)
            with torch.no_grad() if not backward else torch.enable_grad():
                sec, times, warm, y = bh.budget_seconds(runner(impl, backward), args.repeats,
                                                        args.point_seconds)
            if not backward:
                outputs[impl] = y
            fl = flops(prob, impl, causal, backward)
            rec.update(seconds=sec, times=times, warmup=warm, gflop=fl / 1e9,
                       gflop_per_s=fl / sec / 1e9, tokens_per_s=prob.bh * n / sec)
            log(f"  sdpa-section {impl:11s} {pas:7s} {'causal' if causal else 'bidir':6s} "
                f"N={n:6d} {sec * 1e3:10.2f} ms ({len(times)} runs)")
            rows.append(rec)
        base = next(r for r in rows if r["impl"] == "sdpa" and r["pass"] == pas)
        for r in rows:
            if r["pass"] == pas and r["impl"] != "sdpa":
                r["speedup_vs_sdpa"] = base["seconds"] / r["seconds"]
    ref = outputs["sdpa"]
    for r in rows:  # how far each output is from SDPA's (the same inputs, forward)
        if r["impl"] != "sdpa" and r["pass"] == "fwd":
            r["rel_error_vs_sdpa"] = float((outputs[r["impl"]] - ref).norm() / ref.norm())
    return rows


def sdpa_summary(records):
    """Per mask and pass: favor's crossover with SDPA and t_sdpa / t_favor at 4k and 16k."""
    att = [r for r in records if r["section"] == "sdpa"]
    out = []
    for causal, pas in sorted({(r["causal"], r["pass"]) for r in att}):
        pts = sorted((r["n"], r["speedup_vs_sdpa"]) for r in att
                     if r["impl"] == "favor" and r["causal"] == causal and r["pass"] == pas)
        n, note = bh.crossover(pts)
        ratios = dict(pts)
        rec = dict(section="sdpa_summary", causal=causal, crossover_n=n, crossover=note,
                   lengths=[p[0] for p in pts], **{f"ratio_{x}": ratios.get(x) for x in RATIO_AT})
        rec["pass"] = pas
        out.append(rec)
    return out


def call_rows(args, log):
    """Seconds per call at [1, H, N, 64] of the C++ timer, favor._core.attention,
    favor.attention (numpy), favor.torch.attention and SDPA (no_grad): the median over
    --call-rounds rounds in which each runs a loop of calls, the five taking turns."""
    proj = favor.make_projection(DIM, "orthogonal", features=FEATURES, seed=0)
    rows = []
    for causal in args.masks:
        for n in args.call_lengths:
            rng = np.random.default_rng(n)  # the inputs' seed is N
            shape = (1, args.call_heads, n, DIM)
            q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
            qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
            loops = {
                "cpp": lambda c: sum(favor._core.time_attention(q, k, v, proj, "positive",
                                                                causal, c)),
                "core": bh.timed_loop(lambda: favor._core.attention(q, k, v, proj,
                                                                    causal=causal)),
                "numpy": bh.timed_loop(lambda: favor.attention(q, k, v, causal=causal,
                                                               projection=proj)),
                "torch": bh.timed_loop(lambda: ftorch.attention(qt, kt, vt, causal=causal,
                                                                features=FEATURES)),
            }
            if args.has_sdpa:
                loops["sdpa"] = bh.timed_loop(lambda: sdpa(qt, kt, vt, causal))
            with torch.no_grad():
                for loop in loops.values():  # warm-up; the slowest sets the loop length
                    loop(3)
                slowest = max(loop(20) / 20 for loop in loops.values())
                calls = max(10, int(args.call_loop_s / slowest))
                per = {name: [] for name in loops}
                for _ in range(args.call_rounds):
                    for name, loop in loops.items():
                        per[name].append(loop(calls) / calls * 1e6)
            rec = dict(section="call", causal=causal, n=n, shape=list(shape), m=FEATURES,
                       seed=n, calls=calls, rounds=args.call_rounds)
            for name, us in per.items():
                rec[name + "_us"] = float(np.median(us))
                rec[name + "_min_us"] = float(min(us))
            rec["torch_overhead_us"] = rec["torch_us"] - rec["cpp_us"]
            rec["torch_over_numpy_us"] = rec["torch_us"] - rec["numpy_us"]
            rec["numpy_overhead_us"] = rec["numpy_us"] - rec["cpp_us"]
            rows.append(rec)
            log(f"  call N={n} causal={causal}: C++ {rec['cpp_us']:.1f} us, numpy "
                f"{rec['numpy_us']:.1f} us, torch {rec['torch_us']:.1f} us")
    return rows


def _ms(r):
    return bh.fmt_ms(r["seconds"]) if r else "-"


def tables(records):
    """Markdown: the SDPA sweep, the crossover summary, the per-call table (empty string
    for sections that did not run)."""
    out = []
    att = [r for r in records if r["section"] == "sdpa"]
    if att:
        idx = {(r["impl"], r["pass"], r["causal"], r["n"]): r for r in att}
        rows = []
        for causal, pas, n in sorted({(r["causal"], r["pass"], r["n"]) for r in att}):
            s, f, e = (idx.get((i, pas, causal, n)) for i in IMPLS)
            rows.append(["causal" if causal else "bidir", pas, n, _ms(s), _ms(f), _ms(e),
                         f"{s['gflop_per_s']:.1f}", f"{f['gflop_per_s']:.1f}",
                         bh.fmt_ratio(f["speedup_vs_sdpa"]),
                         bh.fmt_ratio(e["speedup_vs_sdpa"]) if e else "-",
                         f"{f['rel_error_vs_sdpa']:.3f}" if "rel_error_vs_sdpa" in f else ""])
        out.append(bh.markdown(["mask", "pass", "N", "SDPA ms", "favor ms", "favor exact ms",
                                "SDPA GFLOP/s", "favor GFLOP/s", "favor vs SDPA",
                                "favor exact vs SDPA", "favor rel. error"], rows))
        summ = [r for r in records if r["section"] == "sdpa_summary"]
        out.append(bh.markdown(
            ["mask", "pass", "crossover N (favor faster above)"]
            + [f"t_SDPA / t_favor at {x}" for x in RATIO_AT],
            [["causal" if r["causal"] else "bidir", r["pass"], r["crossover"]]
             + [bh.fmt_ratio(r[f"ratio_{x}"]) for x in RATIO_AT] for r in summ]))
    calls = [r for r in records if r["section"] == "call"]
    if calls:
        out.append(bh.markdown(
            ["mask", "N", "C++ timer us", "_core.attention us", "favor.attention us",
             "favor.torch us", "SDPA us", "torch - C++ us", "torch - numpy us",
             "torch - C++ us (of minima)"],
            [["causal" if r["causal"] else "bidir", r["n"]]
             + [f"{r[k + '_us']:.1f}" if k + "_us" in r else "-"
                for k in ("cpp", "core", "numpy", "torch", "sdpa")]
             + [f"{r['torch_overhead_us']:.1f}", f"{r['torch_over_numpy_us']:.1f}",
                f"{r['torch_min_us'] - r['cpp_min_us']:.1f}"]
             for r in calls]))
    return "\n\n".join(out)


def meta(args):
    """What the sdpa section's numbers depend on: the backend per mask, seeds, sizes."""
    return dict(sdpa=SDPA_NAME, sdpa_kernels={("causal" if c else "bidir"): sdpa_kernels(c)
                                              for c in args.masks},
                sdpa_sizes=dict(b=BATCH, h=HEADS, d=DIM, m=FEATURES, lengths=args.sdpa_lengths,
                                exact_max_n=args.exact_max_n, point_seconds=args.point_seconds),
                seeds="inputs torch.Generator().manual_seed(N) (call section: "
                      "numpy default_rng(N)); projection orthogonal, seed 0",
                cpu_capability=getattr(torch.backends.cpu, "get_cpu_capability",
                                       lambda: None)())
