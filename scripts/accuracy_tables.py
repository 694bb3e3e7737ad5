#!/usr/bin/env python3
"""Markdown tables from `favor accuracy --out` JSON files (used for docs/accuracy.md).

usage: accuracy_tables.py ACC.json [ACC2.json ...] [--m 256]

Prints, per data setting: the attention error of every estimator x projection at one m, the
best pair, and the orderings theory predicts (orthogonal <= iid, hyperbolic with m
projections <= positive with 2m (equal features), FAVOR++ <= FAVOR+), checked at every m,
with the difference in units of its standard error over seeds.
"""
import argparse
import json
import math
from collections import defaultdict


def load(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        recs += doc["records"] if isinstance(doc, dict) else doc
    return recs


def cell(r):
    return f"{r['attention_rel_error']:.3f} ± {r['attention_rel_error_std']:.3f}"


def check(a, b):
    """a <= b? returns (holds, z) with z = (b - a) / standard error of the difference."""
    se = math.sqrt((a["attention_rel_error_std"] ** 2 + b["attention_rel_error_std"] ** 2)
                   / a["seeds"])
    diff = b["attention_rel_error"] - a["attention_rel_error"]
    return diff >= 0, diff / se if se > 0 else float("inf")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--m", type=int, default=256)
    a = ap.parse_args()
    recs = load(a.files)
    by = {(r["data"], r["estimator"], r["projection"], r["m"]): r for r in recs}
    datas = list(dict.fromkeys(r["data"] for r in recs))
    ests = list(dict.fromkeys(r["estimator"] for r in recs))
    projs = list(dict.fromkeys(r["projection"] for r in recs))
    ms = sorted({r["m"] for r in recs})
    for data in datas:
        print(f"\n### {data}: attention relative error at m = {a.m} (mean ± std over seeds)\n")
        print("| estimator | " + " | ".join(projs) + " |")
        print("|---" * (len(projs) + 1) + "|")
        best = None
        for e in ests:
            row = []
            for p in projs:
                r = by.get((data, e, p, a.m))
                row.append(cell(r) if r else "-")
                if r and (best is None or r["attention_rel_error"] < best["attention_rel_error"]):
                    best = r
            print(f"| {e} | " + " | ".join(row) + " |")
        if best:
            print(f"\nBest at m = {a.m}: **{best['estimator']} / {best['projection']}** "
                  f"({cell(best)}).")
        print(f"\nOrderings over m = {', '.join(map(str, ms))} "
              "(holds / m values; failures with (b - a) / se):\n")
        checks = defaultdict(list)
        for m in ms:
            pairs = [
                ("orthogonal <= iid (positive)", (data, "positive", "orthogonal", m),
                 (data, "positive", "iid", m)),
                ("hyperbolic(m) <= positive(2m), orthogonal", (data, "hyperbolic", "orthogonal", m),
                 (data, "positive", "orthogonal", 2 * m)),
                ("favorpp <= positive, orthogonal", (data, "favorpp", "orthogonal", m),
                 (data, "positive", "orthogonal", m)),
                ("favorpp <= positive, iid", (data, "favorpp", "iid", m),
                 (data, "positive", "iid", m)),
                ("favorsharp <= favorpp, orthogonal", (data, "favorsharp", "orthogonal", m),
                 (data, "favorpp", "orthogonal", m)),
            ]
            for name, ka, kb in pairs:
                if ka in by and kb in by:
                    checks[name].append((m,) + check(by[ka], by[kb]))
        print("| ordering | holds | where it does not (m: z) |")
        print("|---|---|---|")
        for name, rows in checks.items():
            fails = [f"{m}: {z:+.1f}" for m, ok, z in rows if not ok]
            print(f"| {name} | {sum(ok for _, ok, _ in rows)}/{len(rows)} | "
                  f"{', '.join(fails) or '-'} |")


if __name__ == "__main__":
    main()
