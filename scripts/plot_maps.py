#!/usr/bin/env python3
"""Bars of held-out attention error per feature map (favor accuracy --sections maps).

usage: plot_maps.py OUT.png RECORDS.json [RECORDS.json ...]
Each JSON is the --out of `favor accuracy --sections maps`; one panel per data setting,
one group of bars per feature count F, error bars = std over seeds.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out, paths = sys.argv[1], sys.argv[2:]
    records = [r for p in paths for r in json.load(open(p))["maps_records"]]
    settings = list(dict.fromkeys(r["data"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    features = sorted(set(r["features"] for r in records))
    fig, axes = plt.subplots(1, len(settings), figsize=(4.6 * len(settings), 3.8), squeeze=False)
    width = 0.8 / len(methods)
    for ax, setting in zip(axes[0], settings):
        for i, method in enumerate(methods):
            rows = {r["features"]: r for r in records
                    if r["data"] == setting and r["method"] == method}
            xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(features))]
            ax.bar(xs, [rows[f]["attention_rel_error"] for f in features], width,
                   yerr=[rows[f]["attention_rel_error_std"] for f in features],
                   label=method, capsize=2)
        ax.set_xticks(range(len(features)), [f"F = {f}" for f in features])
        ax.set_title("Shakespeare q, k, v" if setting == "files" else setting, fontsize=9)
        ax.set_ylabel("held-out attention rel. error")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle("Feature maps at equal F: random (favor+, ++, #, dct) vs fitted "
                 "(wpff, positive-fit, hedgehog)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
