"""Helpers of favor.bench: the cost model, the timer, memory budgets, tables and the plot.

The cost model is bench/cost_model.hpp (docs/algorithms.md, docs/performance.md) written
once in Python, plus the backward passes of the two autograd baselines.
"""
import math
import os
import platform
import statistics
import time
from collections import namedtuple

Problem = namedtuple("Problem", ["bh", "n", "d", "dv", "m", "f"])
Problem.__doc__ = """One attention layer: bh = batch x heads, n = sequence length (queries =
keys), d = head dim, dv = value dim, m = projections, f = features (m for FAVOR+)."""


def favor_flops(p, causal, chunk):
    """FAVOR forward (cost_model.hpp favor_flops): feature maps 2 N d m for Q and again
    for K; S = phi(K)^T V: 2 N F dv; outputs and normaliser phi(Q) [S s]: 2 N F (dv + 1);
    causal adds the intra-chunk products, 2 N C (F + dv) for chunk length C. Exponentials
    are not counted. plain.favor_plus runs the same products (with its own chunk)."""
    n = float(p.n)
    per_head = 4.0 * n * p.d * p.m + 2.0 * n * p.f * p.dv + 2.0 * n * p.f * (p.dv + 1)
    intra = 2.0 * n * chunk * (p.f + p.dv) if causal else 0.0
    return p.bh * (per_head + intra)


def favor_backward_flops(p, causal, chunk, context):
    """favor's backward as implemented (cost_model.hpp): bidirectional with the forward's
    saved key state (favor.torch saves it when an input requires grad): N (8 d m + 10 F
    (dv + 1)); without it N (10 d m + 12 F (dv + 1)); causal recomputes both projections in
    each of its two sweeps: N (12 d m + 10 F (dv + 1) + 2 C (4 F + 3 (dv + 1)))."""
    n, dm, fv = float(p.n), float(p.d * p.m), float(p.f * (p.dv + 1))
    if causal:
        per_head = n * (12.0 * dm + 10.0 * fv + 2.0 * chunk * (4.0 * p.f + 3.0 * (p.dv + 1)))
    elif context:
        per_head = n * (8.0 * dm + 10.0 * fv)
    else:
        per_head = n * (10.0 * dm + 12.0 * fv)
    return p.bh * per_head


def autograd_favor_backward_flops(p, causal, chunk):
    """plain.favor_plus through autograd: every product of the forward gives two products
    (one per operand), except the projections x W^T, whose W needs no gradient: twice the
    forward less the 4 N d m of the projections."""
    return 2.0 * favor_flops(p, causal, chunk) - 4.0 * p.bh * p.n * p.d * p.m


def softmax_flops(p, causal):
    """Exact softmax attention (cost_model.hpp exact_flops): Q K^T and P V, 2 N^2 (d + dv),
    half of it when causal (the useful work: a materialising implementation computes the
    masked half too, so its causal rate reads half its arithmetic rate)."""
    full = 2.0 * p.n * p.n * (p.d + p.dv)
    return p.bh * (full / 2 if causal else full)


def softmax_backward_flops(p, causal):
    """Softmax attention through autograd: dP = dy V^T, dV = P^T dy, dQ = dS K, dK = dS^T Q:
    twice the forward's products (the softmax's own gradient is elementwise)."""
    return 2.0 * softmax_flops(p, causal)


def median_seconds(fn, repeats, warmup=1):
    """(median, all) wall seconds of fn() over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def budget_seconds(fn, repeats, budget_s):
    """(median, times, warm-ups, last result) of fn(): one warm-up call, then up to
    `repeats` timed calls, stopping once they total budget_s (at least one). A warm-up longer
    than budget_s is kept as the only sample (its one-time costs, page faults and thread
    start-up, are small next to it): warm-ups 0 says so."""
    t0 = time.perf_counter()
    last = fn()
    warm = time.perf_counter() - t0
    if warm > budget_s:
        return warm, [warm], 0, last
    times = []
    while len(times) < repeats and (not times or sum(times) < budget_s):
        t0 = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times, 1, last


def crossover(points):
    """Where the ratio t_baseline / t_favor of sorted (N, ratio) points crosses 1 for the
    last time: (N, note). N is interpolated linearly in log N and log ratio between the
    last point where favor is slower and the next one; (None, note) when favor is faster at
    every N or slower up to the longest."""
    if not points:
        return None, "no points"
    slower = [i for i, (_, r) in enumerate(points) if r < 1.0]
    if not slower:
        return None, f"favor faster at every N (from N = {points[0][0]})"
    j = slower[-1]
    if j == len(points) - 1:
        return None, f"none up to N = {points[-1][0]}"
    (n0, r0), (n1, r1) = points[j], points[j + 1]
    t = -math.log(r0) / (math.log(r1) - math.log(r0))
    n = math.exp(math.log(n0) + t * (math.log(n1) - math.log(n0)))
    return n, f"~{n:.0f} (interpolated between N = {n0} and {n1})"


def timed_loop(fn):
    """loop(calls) -> wall seconds of `calls` calls of fn()."""
    def loop(calls):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return time.perf_counter() - t0
    return loop


def best_per_call(loops, calls, rounds):
    """Seconds per call of each loop(calls) -> total seconds: the best of `rounds` rounds
    in which the loops take turns (drift of the machine hits them alike; the minimum is
    the round least disturbed by other processes, as timeit advises)."""
    best = [math.inf] * len(loops)
    for _ in range(rounds):
        for i, loop in enumerate(loops):
            best[i] = min(best[i], loop(calls) / calls)
    return best


def available_bytes():
    """MemAvailable from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# Peak memory of softmax attention in units of one N x N float32 score matrix per head,
# measured with plain.softmax_attention (ru_maxrss): 2.1-2.3 forward, 3.1-3.4 forward +
# backward (scores, probabilities kept for backward, their gradients, the causal mask).
SOFTMAX_PEAK_SCORES = 4.0


def softmax_heads_per_group(bh, n, budget_bytes):
    """(heads per group, None) or (0, reason): the most heads whose N x N float32 scores fit
    budget_bytes and whose estimated peak (SOFTMAX_PEAK_SCORES score matrices per head)
    fits 80% of the memory available now."""
    scores = 4.0 * n * n
    fit = int(budget_bytes // scores)
    avail = available_bytes()
    if avail is not None:
        fit = min(fit, int(0.8 * avail // (SOFTMAX_PEAK_SCORES * scores)))
    if fit < 1:
        peak = SOFTMAX_PEAK_SCORES * scores
        return 0, (f"one head's scores need {scores / 1e9:.3g} GB (peak ~{peak / 1e9:.3g} GB "
                   f"with backward); budget {budget_bytes / 1e9:.3g} GB, available "
                   f"{(avail or 0) / 1e9:.3g} GB")
    return min(fit, bh), None


def machine():
    """Where the numbers come from: OS, CPU model, logical CPUs, memory."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f
                          if ln.startswith("model name")), model)
    except OSError:
        pass
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        pass
    return {"platform": platform.platform(), "cpu": model, "logical_cpus": os.cpu_count(),
            "memory_bytes": total, "python": platform.python_version()}


def markdown(header, rows):
    """A markdown table of string cells."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def fmt_ms(seconds):
    return "skipped" if seconds is None else f"{seconds * 1e3:.4g}"


def fmt_ratio(x):
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def plot(records, path, title):
    """time vs N, log-log: one panel per masking, a colour per implementation, solid fwd,
    dashed fwd+bwd."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colours = {"favor": "tab:blue", "torch_favor_plus": "tab:orange", "softmax": "tab:red"}
    labels = {"favor": "favor.torch", "torch_favor_plus": "FAVOR+ in plain torch",
              "softmax": "torch softmax attention"}
    panels = sorted({r["causal"] for r in records})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.8), squeeze=False,
                             sharey=True)
    lengths = sorted({r["n"] for r in records})
    for ax, causal in zip(axes[0], panels):
        for impl, colour in colours.items():
            for pas, style in (("fwd", "-"), ("fwd+bwd", "--")):
                pts = sorted((r["n"], r["seconds"]) for r in records
                             if r["impl"] == impl and r["pass"] == pas and r["causal"] == causal
                             and r.get("seconds"))
                if pts:
                    ax.plot(*zip(*pts), style, color=colour, marker="o", markersize=3,
                            label=f"{labels[impl]} {pas}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("sequence length N")
        ax.set_ylabel("seconds per layer call")
        ax.set_title("causal" if causal else "bidirectional")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
