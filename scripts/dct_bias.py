#!/usr/bin/env python3
# docs/projections.md, section dct: run from the repository root after building (build/python).
# Bias of phi(x).phi(y) vs exp(x.y), positive kernel, m = 64: sampled over seeds with
# favor.Projection.draw (W applied in numpy, double) and the closed form over the lattice.
import sys, numpy as np
sys.path.insert(0, "build/python")
import favor
from scipy.stats import norm as N, chi
rng = np.random.default_rng(2024)
m, r, seeds = 64, 0.7, 20000
for d in (16, 64):
    e1 = rng.standard_normal(d); e1 /= np.linalg.norm(e1)
    e2 = rng.standard_normal(d); e2 -= e2 @ e1 * e1; e2 /= np.linalg.norm(e2)
    n = np.arange(d); C = np.array([np.sqrt((2 - (i == 0)) / d) * np.cos(np.pi * (n + .5) * i / d) for i in range(d)])
    u = (np.arange(200000) + 0.5) / 200000
    for ang in (0, 60, 90, 120):
        a = np.deg2rad(ang); x = r * e1; y = r * (np.cos(a) * e1 + np.sin(a) * e2)
        sm = np.exp(x @ y); z = x + y; c = np.exp(-(x @ x + y @ y) / 2)
        out = []
        for mode in ("quantile", "chi", "orthogonal"):
            est = []
            for s in range(seeds):
                W = (favor.Projection.draw(m, d, kind="dct" if mode != "orthogonal" else "orthogonal",
                                           norms="chi" if mode != "quantile" else "quantile", seed=s).matrix).astype(float)
                est.append(np.mean(np.exp(W @ z)) * c)
            est = np.array(est) / sm
            out.append(f"{mode} {est.mean()-1:+.2%} +- {est.std()/np.sqrt(seeds):.2%} (sd {est.std():.3f})")
        # closed form over the rows i (u_i uniform marginally): quantile t = Phi^-1(u), chi sign*F^-1(|2u-1|)
        ai = C @ z
        tq = N.ppf(u); tc = np.sign(u - .5) * chi.ppf(np.abs(2 * u - 1), d)
        ex_q = np.mean([np.mean(np.exp(tq * a_)) for a_ in ai]) * c / sm - 1
        ex_c = np.mean([np.mean(np.exp(tc * a_)) for a_ in ai]) * c / sm - 1
        print(d, ang, " | ".join(out), f"exact quantile {ex_q:+.2%} chi {ex_c:+.2%}", flush=True)
