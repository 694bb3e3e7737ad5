"""python3 -m favor.bench: one attention layer timed several ways in one run.

favor.torch.attention, the same FAVOR+ in plain torch ops (favor.torch.plain.favor_plus,
same projection matrix) and torch's softmax attention (scaled_dot_product_attention where
torch has it, else plain.softmax_attention), forward (under torch.no_grad) and forward +
backward (loss = (y * g).sum(), fixed g; q, k, v require grad), for B = 2, H = 4,
D = Dv = 64, m = 256. Medians of --repeats runs after one warm-up; GFLOP/s from the cost
model (favor/bench_helpers.py, = bench/cost_model.hpp); tokens/s = B H N / seconds, as
`favor bench` counts them. Softmax attention materialises N x N scores, so it runs over
groups of heads whose scores fit --softmax-budget-gb. Then favor's Python overhead per
call against favor._core.time_attention (the C++ call timed in C++), and favor.torch at
favor threads = torch threads against favor forced to more threads (oversubscription).
Sections sdpa and call (favor/bench_sdpa.py): torch 2.x's fused scaled_dot_product_attention
as the exact baseline (crossover, ratios at 4k and 16k) and the per-call overhead of
favor.torch at N = 1..64. Section window (favor/bench_window.py): method='window' (the
window and sinks alone) through C++'s band kernel against the torch band. --sections picks
some; all run by default.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

import favor
import favor.torch as ftorch
from favor.torch import plain

from . import bench_helpers as bh
from . import bench_sdpa
from . import bench_window

BATCH, HEADS, DIM, FEATURES = 2, 4, 64, 256
PLAIN_CHUNK = 64  # plain.favor_plus's default chunk (a Python loop: longer chunks suit it)
IMPLS = ("favor", "torch_favor_plus", "softmax")
SECTIONS = ("attention", "overhead", "oversubscription", "sdpa", "call", "window")


def parse(argv):
    p = argparse.ArgumentParser(prog="python3 -m favor.bench", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    p.add_argument("--mask", choices=("both", "causal", "bidirectional"), default="both")
    p.add_argument("--threads", type=int, default=2, help="torch and favor threads")
    p.add_argument("--oversubscribe", type=int, default=4, help="favor threads of the "
                   "oversubscription test")
    p.add_argument("--softmax-budget-gb", type=float, default=4.0,
                   help="N x N float32 scores per head group of softmax attention")
    p.add_argument("--json", action="store_true", help="print the JSON document, not tables")
    p.add_argument("--out", help="write the JSON document to this file")
    p.add_argument("--plot", help="write time vs N (PNG) to this file")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    bench_sdpa.add_arguments(p)
    a = p.parse_args(argv)
    if a.repeats < 1 or a.threads < 1 or a.oversubscribe < 1 or min(a.lengths) < 1:
        p.error("--repeats, --threads, --oversubscribe and --lengths must be >= 1")
    a.overhead_lengths, a.oversub_n, a.call_loop_s = [16, 64, 256], 4096, 0.1
    if a.quick:
        a.lengths, a.repeats, a.overhead_lengths, a.oversub_n = [64, 128], 1, [16, 64], 256
        a.call_loop_s = 0.01
    a.masks = {"both": [False, True], "causal": [True], "bidirectional": [False]}[a.mask]
    bench_sdpa.finish_args(a)
    return a


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def softmax_impl():
    """(name, fn(q, k, v, causal)) of torch's own softmax attention."""
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return "torch.nn.functional.scaled_dot_product_attention", (
            lambda q, k, v, causal: sdpa(q, k, v, is_causal=causal))
    return ("favor.torch.plain.softmax_attention (this torch has no "
            "scaled_dot_product_attention)", plain.softmax_attention)


def grouped(fn, q, k, v, g, causal, heads, backward):
    """fn over groups of `heads` heads of the flattened B*H axis; backward: each group's
    loss (y * g).sum() is back-propagated before the next group runs."""
    n_bh = q.shape[0] * q.shape[1]
    flat = [t.view(1, n_bh, *t.shape[2:]) for t in (q, k, v, g)]
    for i in range(0, n_bh, heads):
        qs, ks, vs, gs = (t[:, i:i + heads] for t in flat)
        y = fn(qs, ks, vs, causal)
        if backward:
            (y * gs).sum().backward()


def attention_rows(args, proj, w, n, causal, softmax):
    """The six records (3 implementations x fwd, fwd+bwd) at one N and mask."""
    gen = torch.Generator().manual_seed(n)
    q, k, v, g = (torch.randn(BATCH, HEADS, n, DIM, generator=gen) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    chunk = favor.kernel_info()["causal_chunk"]
    prob = bh.Problem(BATCH * HEADS, n, DIM, DIM, FEATURES, FEATURES)
    heads, reason = bh.softmax_heads_per_group(prob.bh, n, args.softmax_budget_gb * 1e9)
    fns = {
        "favor": lambda q_, k_, v_: ftorch.attention(q_, k_, v_, causal=causal, projection=proj),
        "torch_favor_plus": lambda q_, k_, v_: plain.favor_plus(q_, k_, v_, w, causal=causal,
                                                               chunk=PLAIN_CHUNK),
    }
    flops = {
        ("favor", "fwd"): bh.favor_flops(prob, causal, chunk),
        ("favor", "fwd+bwd"): bh.favor_flops(prob, causal, chunk)
        + bh.favor_backward_flops(prob, causal, chunk, context=not causal),
        ("torch_favor_plus", "fwd"): bh.favor_flops(prob, causal, PLAIN_CHUNK),
        ("torch_favor_plus", "fwd+bwd"): bh.favor_flops(prob, causal, PLAIN_CHUNK)
        + bh.autograd_favor_backward_flops(prob, causal, PLAIN_CHUNK),
        ("softmax", "fwd"): bh.softmax_flops(prob, causal),
        ("softmax", "fwd+bwd"): bh.softmax_flops(prob, causal)
        + bh.softmax_backward_flops(prob, causal),
    }

    def runner(impl, backward):
        if impl == "softmax":
            if backward:
                return lambda: grouped(softmax[1], *leaves, g, causal, heads, True)
            return lambda: grouped(softmax[1], q, k, v, g, causal, heads, False)
        fn = fns[impl]
        if not backward:
            return lambda: fn(q, k, v)

        def step():
            for t in leaves:
                t.grad = None
            (fn(*leaves) * g).sum().backward()
        return step

    rows = []
    for pas in ("fwd", "fwd+bwd"):
        for impl in IMPLS:
            rec = dict(section="attention", impl=impl, causal=causal, n=n, b=BATCH, h=HEADS,
                       bh=prob.bh, d=DIM, dv=DIM, m=FEATURES, threads=args.threads)
            rec["pass"] = pas
            if impl == "softmax":
                rec["heads_per_group"] = heads
                if reason:
                    rec["skipped"] = reason
                    rows.append(rec)
                    log(f"  {impl:16s} {pas:7s} N={n:6d} skipped: {reason}")
                    continue
                rec["groups"] = math.ceil(prob.bh / heads)
            with torch.no_grad() if pas == "fwd" else torch.enable_grad():
                sec, times = bh.median_seconds(runner(impl, pas == "fwd+bwd"), args.repeats)
            rec.update(seconds=sec, times=times, gflop=flops[(impl, pas)] / 1e9,
                       gflop_per_s=flops[(impl, pas)] / sec / 1e9,
                       tokens_per_s=prob.bh * n / sec)
            log(f"  {impl:16s} {pas:7s} N={n:6d} {sec * 1e3:10.2f} ms")
            rows.append(rec)
        fav = next(r for r in rows if r["impl"] == "favor" and r["pass"] == pas)
        for r in rows:
            if r["pass"] == pas and r["impl"] != "favor" and "seconds" in r:
                fav["speedup_vs_" + r["impl"]] = r["seconds"] / fav["seconds"]
    return rows


def overhead_rows(args, proj):
    """Seconds per call of favor.attention (numpy) and favor.torch.attention (no_grad)
    against favor._core.time_attention (the same C++ call timed inside C++, output buffer
    allocated once) on the same arrays: best of max(repeats, 7) interleaved rounds."""
    rows, rounds = [], max(args.repeats, 7)
    for causal in args.masks:
        for n in args.overhead_lengths:
            rng = np.random.default_rng(n)
            q, k, v = (rng.standard_normal((BATCH, HEADS, n, DIM), dtype=np.float32)
                       for _ in range(3))
            qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))

            def cpp(calls):
                return sum(favor._core.time_attention(q, k, v, proj, "positive", causal, calls))
            calls = max(10, int(args.call_loop_s * 5 / cpp(5)))
            with torch.no_grad():
                numpy_s, torch_s, cpp_s = bh.best_per_call([
                    bh.timed_loop(lambda: favor.attention(q, k, v, causal=causal, projection=proj)),
                    bh.timed_loop(lambda: ftorch.attention(qt, kt, vt, causal=causal,
                                                           projection=proj)),
                    cpp], calls, rounds)
            rows.append(dict(section="overhead", causal=causal, n=n, bh=BATCH * HEADS,
                             calls=calls, rounds=rounds, cpp_us=cpp_s * 1e6,
                             numpy_us=numpy_s * 1e6, torch_us=torch_s * 1e6,
                             numpy_overhead_us=(numpy_s - cpp_s) * 1e6,
                             torch_overhead_us=(torch_s - cpp_s) * 1e6))
            log(f"  overhead N={n} causal={causal}: C++ {cpp_s * 1e6:.1f} us, numpy "
                f"{numpy_s * 1e6:.1f} us, torch {torch_s * 1e6:.1f} us")
    return rows


def oversubscription_rows(args, proj):
    """favor.torch forward (no_grad) at favor threads = torch threads against favor forced
    to --oversubscribe threads: medians of max(repeats, 7) runs, the settings alternating."""
    rows, reps, n = [], max(args.repeats, 7), args.oversub_n
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(BATCH, HEADS, n, DIM, generator=gen) for _ in range(3))
    for causal in args.masks:
        times = {args.threads: [], args.oversubscribe: []}
        with torch.no_grad():
            for r in range(reps + 1):
                for t in times:
                    favor.set_num_threads(t)
                    t0 = time.perf_counter()
                    ftorch.attention(q, k, v, causal=causal, projection=proj)
                    if r:  # the first round warms up
                        times[t].append(time.perf_counter() - t0)
        favor.set_num_threads(args.threads)
        base, over = (float(np.median(times[t])) for t in (args.threads, args.oversubscribe))
        rows.append(dict(section="oversubscription", causal=causal, n=n, bh=BATCH * HEADS,
                         torch_threads=torch.get_num_threads(), favor_threads=args.threads,
                         oversubscribed_threads=args.oversubscribe, seconds=base,
                         oversubscribed_seconds=over, slowdown=over / base,
                         times=times[args.threads], oversubscribed_times=times[args.oversubscribe]))
        log(f"  oversubscription causal={causal}: {base * 1e3:.2f} ms vs {over * 1e3:.2f} ms")
    return rows


def tables(doc):
    att = [r for r in doc["records"] if r["section"] == "attention"]
    out, idx = [], {(r["impl"], r["pass"], r["causal"], r["n"]): r for r in att}
    rows = []
    for causal, pas, n in sorted({(r["causal"], r["pass"], r["n"]) for r in att}):
        f, p, s = (idx[(i, pas, causal, n)] for i in IMPLS)
        soft = bh.fmt_ms(s.get("seconds"))
        if s.get("groups", 1) > 1:
            soft += f" ({s['groups']} groups)"
        rows.append(["causal" if causal else "bidir", pas, n, bh.fmt_ms(f["seconds"]),
                     bh.fmt_ms(p["seconds"]), soft, f"{f['gflop_per_s']:.1f}",
                     f"{p['gflop_per_s']:.1f}",
                     f"{s['gflop_per_s']:.1f}" if "seconds" in s else "-",
                     bh.fmt_ratio(f.get("speedup_vs_torch_favor_plus")),
                     bh.fmt_ratio(f.get("speedup_vs_softmax")), f"{f['tokens_per_s']:.3g}"])
    out.append(rows and bh.markdown(["mask", "pass", "N", "favor ms", "plain-torch FAVOR+ ms",
                            "softmax ms", "favor GFLOP/s", "plain GFLOP/s", "softmax GFLOP/s",
                            "favor speed-up vs plain", "favor speed-up vs softmax",
                            "favor tokens/s"], rows))
    ov = [r for r in doc["records"] if r["section"] == "overhead"]
    out.append(ov and bh.markdown(
        ["mask", "N", "C++ (time_attention) us", "favor.attention us", "favor.torch us",
         "numpy overhead us", "torch overhead us"],
        [["causal" if r["causal"] else "bidir", r["n"], f"{r['cpp_us']:.1f}",
          f"{r['numpy_us']:.1f}",
          f"{r['torch_us']:.1f}", f"{r['numpy_overhead_us']:.1f}", f"{r['torch_overhead_us']:.1f}"]
         for r in ov]))
    os_ = [r for r in doc["records"] if r["section"] == "oversubscription"]
    out.append(os_ and bh.markdown(
        ["mask", "N", "torch threads", "favor threads", "ms", "favor threads (forced)", "ms",
         "slowdown"],
        [["causal" if r["causal"] else "bidir", r["n"], r["torch_threads"], r["favor_threads"],
          bh.fmt_ms(r["seconds"]), r["oversubscribed_threads"],
          bh.fmt_ms(r["oversubscribed_seconds"]),
          f"{r['slowdown']:.2f}"] for r in os_]))
    out.append(bench_sdpa.tables(doc["records"]))
    out.append(bench_window.tables(doc["records"]))
    return "\n\n".join(t for t in out if t)


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(args.threads)
    favor.set_num_threads(args.threads)
    proj = favor.make_projection(DIM, "orthogonal", features=FEATURES, seed=0)
    w = torch.tensor(np.asarray(proj.matrix), dtype=torch.float32)
    softmax = softmax_impl()
    given = sys.argv[1:] if argv is None else argv
    meta = dict(command="python3 -m favor.bench " + " ".join(given),
                torch_threads=torch.get_num_threads(), favor_threads=favor.num_threads(),
                build_info=favor.build_info(), torch_version=torch.__version__,
                numpy_version=np.__version__, machine=bh.machine(), softmax=softmax[0],
                softmax_budget_gb=args.softmax_budget_gb, b=BATCH, h=HEADS, d=DIM, dv=DIM,
                m=FEATURES, projection="orthogonal, seed 0", repeats=args.repeats, warmup=1,
                favor_chunk=favor.kernel_info()["causal_chunk"], plain_chunk=PLAIN_CHUNK,
                time=time.strftime("%Y-%m-%d %H:%M:%S %z"), loadavg_start=os.getloadavg(),
                sections=args.sections)
    if "sdpa" in args.sections:
        meta.update(bench_sdpa.meta(args))
    log(f"favor.bench: torch {torch.__version__}, {meta['torch_threads']} torch threads, "
        f"{meta['favor_threads']} favor threads; {meta['build_info']}")
    records = []
    doc = {"meta": meta, "records": records}

    def save(complete):  # after every block: a long run cut short keeps what it measured
        meta.update(complete=complete, loadavg_end=os.getloadavg())
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1)

    on = set(args.sections)
    for causal in args.masks if "attention" in on else []:
        for n in args.lengths:
            records += attention_rows(args, proj, w, n, causal, softmax)
            save(False)
    for causal in args.masks if "sdpa" in on else []:
        for n in args.sdpa_lengths:
            records += bench_sdpa.sdpa_rows(args, n, causal, log)
            save(False)
    for causal in args.masks if "window" in on else []:
        for n in args.lengths:
            records += bench_window.window_rows(args, n, causal, log, BATCH, HEADS, DIM)
            save(False)
    records += bench_sdpa.sdpa_summary(records)
    records += overhead_rows(args, proj) if "overhead" in on else []
    records += bench_sdpa.call_rows(args, log) if "call" in on else []
    records += oversubscription_rows(args, proj) if "oversubscription" in on else []
    save(True)
    if args.plot:
        bh.plot([r for r in records if r["section"] == "attention"], args.plot,
                f"B = {BATCH}, H = {HEADS}, D = Dv = {DIM}, m = {FEATURES}, "
                f"{args.threads} threads; torch {torch.__version__}; {meta['machine']['cpu']}")
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    print(f"favor.bench: B = {BATCH}, H = {HEADS}, D = Dv = {DIM}, m = {FEATURES}; "
          f"torch {torch.__version__} ({meta['torch_threads']} threads); {meta['build_info']}")
    print(f"softmax: {softmax[0]}; run over head groups whose N x N float32 scores fit "
          f"{args.softmax_budget_gb:g} GB; tokens/s = B H N / s; medians of {args.repeats} "
          f"(1 warm-up); fwd under torch.no_grad(); overhead: best of interleaved rounds")
    print(f"sdpa section: {bench_sdpa.SDPA_NAME} ({meta.get('sdpa_kernels')}); medians of "
          f"up to {args.repeats} runs totalling {args.point_seconds:g} s; call section: "
          f"[1, {args.call_heads}, N, {DIM}], medians of {args.call_rounds} interleaved rounds; load average "
          f"{meta['loadavg_start']} at the start, {meta['loadavg_end']} at the end\n")
    print(tables(doc))


if __name__ == "__main__":
    main()
