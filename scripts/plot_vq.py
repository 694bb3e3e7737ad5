#!/usr/bin/env python3
"""The figures of docs/vq.md.

  accuracy: `favor accuracy --sections vq` results (one JSON per data setting, codebooks
            held out; optionally a second, in-sample one after a colon): attention error
            against exact softmax as the codebook grows, hard and soft VQ, with FAVOR+ at
            m = c beside it; plus the soft -> hard curve: |y_soft - y_hard| /
            |y_hard| against tau (computed here with favor's numpy API on the keys given).
  bench:    `favor bench --sections vq` results: seconds against N for VQ, FAVOR+ and exact,
            forward and backward, bidirectional and causal.

usage:
  plot_vq.py accuracy OUT.png NAME=HELDOUT.json[:INSAMPLE.json] ... [--qkv DIR] [--soft-json OUT.json]
  plot_vq.py bench OUT.png RESULT.json
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def accuracy_panel(ax, name, records, insample=None):
    hard = sorted((r for r in records if not r["soft"]), key=lambda r: r["codes"])
    cs = [r["codes"] for r in hard]
    ax.errorbar(cs, [r["attention_rel_error"] for r in hard],
                [r["attention_rel_error_std"] for r in hard], fmt="o-", label="hard VQ (held out)")
    if insample:
        ins = sorted((r for r in insample if not r["soft"]), key=lambda r: r["codes"])
        ax.plot([r["codes"] for r in ins], [r["attention_rel_error"] for r in ins], "x-.",
                color="C0", alpha=0.5, label="hard VQ, codebook fitted on the evaluated keys")
    for tau_rel in sorted({r["tau_rel"] for r in records if r["soft"]}):
        soft = sorted((r for r in records if r["soft"] and r["tau_rel"] == tau_rel),
                      key=lambda r: r["codes"])
        ax.plot([r["codes"] for r in soft], [r["attention_rel_error"] for r in soft], ".:",
                label=f"soft VQ (held out), tau = {tau_rel:g} x quant. error")
    ax.errorbar(cs, [r["favor_rel_error"] for r in hard], [r["favor_rel_error_std"] for r in hard],
                fmt="s--", color="gray", label="FAVOR+ (positive, orthogonal), m = c")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("codes c (features m for FAVOR+)")
    ax.set_ylabel("attention relative error vs exact")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def soft_to_hard(qkv, codes=64, seed=0):
    """|y_soft - y_hard| / |y_hard| for a k-means codebook, over tau (relative to the mean
    quantisation error), bidirectional and causal."""
    import favor

    q, k, v = (np.load(f"{qkv}/{x}.npy") for x in "qkv")
    book = favor.Codebook.kmeans(k, codes, seed=seed)
    err = book.quantisation_error(k)
    rows = []
    for causal in (False, True):
        hard = favor.vq_attention(q, k, v, book, causal=causal)
        for tau_rel in (3.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001):
            soft = favor.vq_attention(q, k, v, book, causal=causal, tau=tau_rel * err)
            rows.append({"causal": causal, "tau_rel": tau_rel, "tau": tau_rel * err,
                         "codes": codes,
                         "rel_diff": float(np.linalg.norm(soft - hard) / np.linalg.norm(hard))})
    return rows


def accuracy(args):
    data = []
    for spec in args.results:
        name, files = spec.split("=", 1)
        paths = files.split(":")
        data.append((name, [json.load(open(p))["vq_records"] for p in paths]))
    panels = len(data) + (1 if args.qkv else 0)
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2), squeeze=False)
    for ax, (name, results) in zip(axes[0], data):
        accuracy_panel(ax, name, results[0], results[1] if len(results) > 1 else None)
    if args.qkv:
        rows = soft_to_hard(args.qkv)
        ax = axes[0][-1]
        for causal, style in ((False, "o-"), (True, "s--")):
            sel = [r for r in rows if r["causal"] == causal]
            ax.plot([r["tau_rel"] for r in sel], [max(r["rel_diff"], 1e-9) for r in sel], style,
                    label="causal" if causal else "bidirectional")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tau / mean quantisation error")
        ax.set_ylabel("|y_soft - y_hard| / |y_hard|")
        ax.set_title(f"soft VQ -> hard VQ as tau -> 0 (c = {rows[0]['codes']})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        if args.soft_json:
            with open(args.soft_json, "w") as f:
                json.dump(rows, f, indent=1)
        for r in rows:
            print(f"causal={r['causal']!s:5} tau_rel={r['tau_rel']:<6g} rel_diff={r['rel_diff']:.3g}")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


def bench(args):
    data = json.load(open(args.result))
    records = [r for r in (data["records"] if isinstance(data, dict) else data)
               if r.get("section") == "vq"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, pass_ in zip(axes, ("forward", "backward")):
        for method, color in (("vq", "C0"), ("favor", "C1"), ("exact", "C2")):
            for causal, style in ((False, "o-"), (True, "s--")):
                sel = sorted((r for r in records if r["method"] == method and
                              r["pass"] == pass_ and r["causal"] == causal), key=lambda r: r["n"])
                if sel:
                    label = {"vq": "VQ (c = 256)", "favor": "FAVOR+ (m = 256)",
                             "exact": "exact"}[method] + (", causal" if causal else "")
                    ax.plot([r["n"] for r in sel], [r["seconds"] for r in sel], style,
                            color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (B*H = 8, D = Dv = 64)")
        ax.set_ylabel("seconds")
        ax.set_title(pass_)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("accuracy")
    a.add_argument("out")
    a.add_argument("results", nargs="+", help="NAME=RESULT.json")
    a.add_argument("--qkv", help="q.npy, k.npy, v.npy for the soft -> hard curve")
    a.add_argument("--soft-json")
    b = sub.add_parser("bench")
    b.add_argument("out")
    b.add_argument("result")
    args = ap.parse_args()
    accuracy(args) if args.what == "accuracy" else bench(args)


if __name__ == "__main__":
    main()
