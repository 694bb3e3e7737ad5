#!/usr/bin/env python3
"""Queries, keys and values from real text, for `favor accuracy --q --k --v`.

Characters of a text (default: tinyshakespeare) get 48-dimensional embeddings from the
positive PMI of their co-occurrences within +-2 positions (truncated SVD); a position's
representation mixes its character with the two before it. Each of H heads projects that
with its own random maps: q = h Wq, k = h (Wq + 0.5 G) (so queries and keys are correlated,
as in a trained model, but not equal), v = h Wv. Rows are rescaled so that the mean |q| and
|k| equal --norm (with the default scale 1/sqrt(D), |x| = norm / D^(1/4)). The result is
anisotropic, clustered and has non-zero means: what learned attention inputs look like, and
what the data-adapted estimators (FAVOR++, FAVOR#) are for.

usage: shakespeare_qkv.py TEXT OUTDIR [--n 1024] [--heads 4] [--d 64] [--norm 4.2] [--seed 7]
"""
import argparse
import os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("text")
    ap.add_argument("outdir")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--norm", type=float, default=4.2)
    ap.add_argument("--offset", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    text = open(a.text, encoding="utf-8").read()
    vocab = sorted(set(text))
    ids = np.array([vocab.index(c) for c in text], dtype=np.int64)
    V = len(vocab)
    counts = np.zeros((V, V))
    for lag in (1, 2):
        np.add.at(counts, (ids[:-lag], ids[lag:]), 1.0)
    counts = counts + counts.T + 1e-3
    total = counts.sum()
    row = counts.sum(1, keepdims=True)
    pmi = np.maximum(np.log(counts * total / (row * row.T)), 0.0)
    u, s, _ = np.linalg.svd(pmi)
    emb = u[:, :48] * np.sqrt(s[:48])
    seq = ids[a.offset:a.offset + a.n + 2]
    h = emb[seq[2:]] + 0.5 * emb[seq[1:-1]] + 0.25 * emb[seq[:-2]]
    rng = np.random.default_rng(a.seed)
    q = np.empty((1, a.heads, a.n, a.d), np.float32)
    k = np.empty_like(q)
    v = np.empty_like(q)
    for head in range(a.heads):
        wq = rng.standard_normal((48, a.d))
        wk = wq + 0.5 * rng.standard_normal((48, a.d))
        wv = rng.standard_normal((48, a.d))
        for out, w in ((q, wq), (k, wk)):
            x = h @ w
            out[0, head] = x * (a.norm / np.linalg.norm(x, axis=1).mean())
        x = h @ wv
        v[0, head] = x / x.std()
    os.makedirs(a.outdir, exist_ok=True)
    for name, t in (("q", q), ("k", k), ("v", v)):
        np.save(os.path.join(a.outdir, name + ".npy"), t)
    x = q[0, 0] / a.d ** 0.25
    y = k[0, 0] / a.d ** 0.25
    print(f"wrote {a.outdir}/q.npy k.npy v.npy [1, {a.heads}, {a.n}, {a.d}]; head 0: "
          f"mean |x| {np.linalg.norm(x, axis=1).mean():.2f}, mean x.y {np.mean(x @ y.T):.2f}, "
          f"max x.y {np.max(x @ y.T):.2f}")


if __name__ == "__main__":
    main()
