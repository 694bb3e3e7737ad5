#!/usr/bin/env python3
"""Draws `favor bench` records: time vs N (log-log), favor vs exact, bidirectional and causal.

usage: plot_bench.py RECORDS.json OUT.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(records_path, out_path):
    with open(records_path) as f:
        records = json.load(f)
    sweep = [r for r in records if r["method"] in ("favor", "exact") and r.get("pass", "forward") == "forward"
             and r.get("section", "sweep") == "sweep"]
    if not sweep:
        raise SystemExit("no favor/exact records to plot")
    bh = max(r["bh"] for r in sweep)
    threads = max(r["threads"] for r in sweep)
    fig, ax = plt.subplots(figsize=(7, 5))
    styles = {("favor", False): ("C0", "-", "o"), ("favor", True): ("C0", "--", "s"),
              ("exact", False): ("C3", "-", "o"), ("exact", True): ("C3", "--", "s")}
    for (method, causal), (color, line, marker) in styles.items():
        rows = sorted((r for r in sweep if r["method"] == method and r["causal"] == causal
                       and r["bh"] == bh and r["threads"] == threads), key=lambda r: r["n"])
        if rows:
            ax.loglog([r["n"] for r in rows], [r["seconds"] for r in rows], color=color, linestyle=line,
                      marker=marker, label=f"{method} {'causal' if causal else 'bidirectional'}")
    first = sweep[0]
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"forward pass, B*H = {bh}, D = {first['d']}, m = {first['m']}, {threads} threads")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_path, format="png", dpi=120)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
