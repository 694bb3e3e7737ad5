#!/usr/bin/env python3
"""Draws `favor accuracy` results: one row of panels per data setting.

  1. attention relative error vs m, one line per estimator, for the orthogonal projection;
  2. attention relative error vs m, one line per projection, for the positive estimator;
  3. kernel relative MSE vs m, one line per estimator, for iid projections, with the
     closed-form iid MSE (math.md s.4) dashed in the same colour.

Log-log axes; error bars are the standard deviation over the projection seeds. Where the
sweep lacks the orthogonal projection, iid projections or the positive estimator, the first
one listed stands in.

usage: plot_accuracy.py RESULT.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def pick(preferred, available):
    return preferred if preferred in available else available[0]


def plottable(rows, *keys):
    """The rows whose values are finite numbers (JSON null marks an overflow) and > 0 (log axes)."""
    return sorted((r for r in rows if all(isinstance(r.get(k), (int, float)) for k in keys)
                   and r[keys[0]] > 0), key=lambda r: r["m"])


def errorbar(ax, rows, key, std_key, color, label, std_scale=None):
    rows = plottable(rows, key, std_key)
    if not rows:
        return
    ms = [r["m"] for r in rows]
    ys = [r[key] for r in rows]
    stds = [r[std_key] * (std_scale(r) if std_scale else 1.0) for r in rows]
    # On a log axis a bar reaching zero or below is drawn down to 10% of the value.
    lower = [min(s, 0.9 * y) for s, y in zip(stds, ys)]
    ax.errorbar(ms, ys, yerr=[lower, stds], color=color, marker="o", markersize=3, capsize=2,
                label=label)


def dashed(ax, rows, key, color, style, label):
    rows = plottable(rows, key)
    if rows:
        ax.plot([r["m"] for r in rows], [r[key] for r in rows], color=color, linestyle=style,
                label=label)


def main(result_path, out_path):
    with open(result_path) as f:
        result = json.load(f)
    meta, records = result["meta"], result["records"]
    if not records:
        raise SystemExit("no records to plot")
    estimators, projections = meta["estimators"], meta["projections"]
    settings = [s["label"] for s in meta["data"]]
    colors = {name: f"C{i}" for i, name in enumerate(estimators)}
    proj_colors = {name: f"C{i}" for i, name in enumerate(projections)}
    by_proj = pick("orthogonal", projections)
    by_est = pick("positive", estimators)
    kernel_proj = pick("iid", projections)

    fig, axes = plt.subplots(len(settings), 3, figsize=(16, 4.2 * len(settings)), squeeze=False)
    for row, (label, setting) in enumerate(zip(settings, meta["data"])):
        data = [r for r in records if r["data"] == label]
        where = f"{label}, |x| ~ {setting['x_norm_mean']:.3g}"
        ax = axes[row][0]
        for e in estimators:
            rows = [r for r in data if r["estimator"] == e and r["projection"] == by_proj]
            if rows:
                errorbar(ax, rows, "attention_rel_error", "attention_rel_error_std", colors[e], e)
        ax.set_title(f"estimators, {by_proj} projections\n{where}", fontsize=9)
        ax.set_ylabel("attention output rel. error")
        ax = axes[row][1]
        for p in projections:
            rows = [r for r in data if r["estimator"] == by_est and r["projection"] == p]
            if rows:
                errorbar(ax, rows, "attention_rel_error", "attention_rel_error_std", proj_colors[p],
                         p)
        ax.set_title(f"projections, {by_est} estimator\n{where}", fontsize=9)
        ax.set_ylabel("attention output rel. error")
        ax = axes[row][2]
        for e in estimators:
            rows = [r for r in data if r["estimator"] == e and r["projection"] == kernel_proj]
            if not rows:
                continue
            errorbar(ax, [r for r in rows if isinstance(r["kernel_mse"], (int, float))],
                     "kernel_rel_mse", "kernel_mse_std", colors[e], e,
                     std_scale=lambda r: r["kernel_rel_mse"] / r["kernel_mse"])
            dashed(ax, rows, "kernel_rel_mse_closed_form", colors[e], "--", f"{e} closed form")
            dashed(ax, rows, "kernel_rel_mse_upper_bound", colors[e], ":", f"{e} bound")
        pairs = meta["kernel_pairs"]
        ax.set_title(f"kernel MSE / mean SM^2, {kernel_proj} projections, {pairs[0]} x {pairs[1]} "
                     f"pairs\n{where}", fontsize=9)
        ax.set_ylabel("kernel relative MSE")
        for ax in axes[row]:
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("projections m (F = 2m for trig, hyperbolic)")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
    causal = ", causal" if meta.get("causal") else ""
    fig.suptitle(f"favor accuracy{causal}: N = {meta['n']}, D = {meta['d']}, Dv = {meta['dv']}, "
                 f"scale = {meta['scale']:.4g}, {meta['seeds']} seeds (bars: std over seeds)")
    # Leave room for the suptitle: about 0.5 inch at the top whatever the number of rows.
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    fig.savefig(out_path, format="png", dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
