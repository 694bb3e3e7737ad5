#!/usr/bin/env python3
"""Does product quantisation pay in Transformer-VQ attention? (docs/vq.md, seed 002 eq. 38)

Product quantisation (PQ) splits each key into G groups of D/G dimensions and quantises each
group with its own codebook of c_g codes. In attention, exp(q.k^) = prod_g exp(q_g.C^g_(z_g)),
but the sum over keys of that product does not factorise over groups: an exact linear-time
state needs one entry [sum v | count] per code tuple that occurs, up to min(N, c_g^G). This
script measures, on the same keys, the attention error of plain VQ (c codes: c state entries)
and of PQ (the occurring tuples: T state entries), both against exact softmax attention with
the unquantised keys, so that the two can be compared per byte of state. Codebooks come from
k-means (k-means++ seeding, Lloyd iterations) in numpy, fixed seeds.

usage: vq_product_quantisation.py OUT.json [--qkv DIR] [--n 2048] [--heads 4] [--plot OUT.png]
  --qkv DIR   q.npy, k.npy, v.npy [1, H, N, D] (e.g. from scripts/shakespeare_qkv.py);
              without it, Gaussian inputs with |q| = |k| = 4.2 D^(1/4) / 2.83 are drawn.
  --quick     3 Lloyd iterations, VQ with 16 and 64 codes, PQ with 4 and 16 codes per group,
              Gaussian N = 512 unless --n is given: a smoke test of the command line
"""
import argparse
import json

import numpy as np

VQ_CODES = (16, 64, 256, 1024)
PQ_CODES = (4, 8, 16, 32, 64)
QUICK_VQ_CODES, QUICK_PQ_CODES = (16, 64), (4, 16)


def kmeans(x, c, rng, iterations=25):
    """k-means++ seeding then Lloyd; returns (codes c x d, assignment)."""
    n = x.shape[0]
    centres = [x[rng.integers(n)]]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, c):
        centres.append(x[rng.choice(n, p=d2 / d2.sum())] if d2.sum() > 0 else x[rng.integers(n)])
        d2 = np.minimum(d2, ((x - centres[-1]) ** 2).sum(1))
    C = np.array(centres)
    for _ in range(iterations):
        z = assign(x, C)
        for s in range(c):
            members = x[z == s]
            if len(members):
                C[s] = members.mean(0)
    return C, assign(x, C)


def assign(x, C):
    return np.argmin((C * C).sum(1)[None, :] - 2 * x @ C.T, axis=1)


def attention(q, k, v, scale):
    logits = scale * q @ k.T
    a = np.exp(logits - logits.max(1, keepdims=True))
    return (a @ v) / a.sum(1, keepdims=True)


def rel_error(y, exact):
    return float(np.linalg.norm(y - exact) / np.linalg.norm(exact))


def study(q, k, v, seed, vq_codes=VQ_CODES, pq_codes=PQ_CODES, iterations=25):
    """Rows of (method, c or c_g, G, state entries, codebook floats, error) averaged over heads."""
    H, N, D = q.shape[1], q.shape[2], q.shape[3]
    scale = 1.0 / np.sqrt(D)
    rows = {}
    for h in range(H):
        qh, kh, vh = (x[0, h].astype(np.float64) for x in (q, k, v))
        exact = attention(qh, kh, vh, scale)
        for c in vq_codes:
            if c > N:
                continue
            C, z = kmeans(kh, c, np.random.default_rng(seed + h), iterations)
            err = rel_error(attention(qh, C[z], vh, scale), exact)
            rows.setdefault(("vq", c, 1), []).append((c, c * D, err))
        for G in (2, 4):
            for cg in pq_codes:
                w = D // G
                parts, tuples = [], np.zeros(N, dtype=np.int64)
                for g in range(G):
                    Cg, zg = kmeans(kh[:, g * w:(g + 1) * w], cg,
                                    np.random.default_rng(seed + 97 * g + h), iterations)
                    parts.append(Cg[zg])
                    tuples = tuples * cg + zg
                khat = np.concatenate(parts, axis=1)
                err = rel_error(attention(qh, khat, vh, scale), exact)
                rows.setdefault(("pq", cg, G), []).append((len(np.unique(tuples)), cg * D, err))
    out = []
    for (method, c, G), vals in sorted(rows.items()):
        vals = np.array(vals, dtype=np.float64)
        out.append({"method": method, "codes": c, "groups": G,
                    "state_entries": float(vals[:, 0].mean()),
                    "codebook_floats": int(vals[0, 1]), "error": float(vals[:, 2].mean())})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--qkv")
    ap.add_argument("--n", type=int, default=None, help="Gaussian tokens (default 2048; "
                    "--quick: 512)")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot")
    ap.add_argument("--quick", action="store_true", help="a smoke test: few iterations and codes")
    args = ap.parse_args()
    n = args.n or (512 if args.quick else 2048)
    sizes = (dict(vq_codes=QUICK_VQ_CODES, pq_codes=QUICK_PQ_CODES, iterations=3) if args.quick
             else {})
    print(f"seed {args.seed}")
    data = {}
    if args.qkv:
        q, k, v = (np.load(f"{args.qkv}/{x}.npy") for x in "qkv")
        data["shakespeare"] = study(q, k, v, args.seed, **sizes)
    rng = np.random.default_rng(args.seed)
    D = 64
    shape = (1, args.heads, n, D)
    norm = 4.2 / np.sqrt(8.0)  # |x| = 1.48, the scale of the real inputs above
    q, k, v = (rng.standard_normal(shape) for _ in range(3))
    q *= norm / np.sqrt(D)
    k *= norm / np.sqrt(D)
    data["gaussian"] = study(q, k, v, args.seed, **sizes)
    for name, rows in data.items():
        print(f"{name}:\n  method  codes  G  state_entries  codebook_floats  error")
        for r in rows:
            print(f"  {r['method']:6s} {r['codes']:6d} {r['groups']:2d} {r['state_entries']:13.0f}"
                  f"  {r['codebook_floats']:15d}  {r['error']:.4f}")
    with open(args.out, "w") as f:
        json.dump(data, f, indent=1)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(data), figsize=(5.5 * len(data), 4), squeeze=False)
        for ax, (name, rows) in zip(axes[0], data.items()):
            for (method, G), style in {("vq", 1): "o-", ("pq", 2): "s--", ("pq", 4): "^:"}.items():
                sel = [r for r in rows if r["method"] == method and r["groups"] == G]
                label = "VQ (c codes)" if method == "vq" else f"PQ, G = {G} (occurring tuples)"
                ax.plot([r["state_entries"] for r in sel], [r["error"] for r in sel], style, label=label)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("state entries per head ([sum v | count] rows)")
            ax.set_ylabel("attention relative error vs exact")
            ax.set_title(name)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
