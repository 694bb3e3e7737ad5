"""favor.fit_features: a feature map fitted to data by distillation (Hedgehog; DiJiang's WPFF
weights): the C++ fit (favor::fit_features, the one `favor fit` runs) through its binding,
favor._core.fit_features.

The map's learned parameters (per-head projections W, biases b, feature weights lambda) are
trained by the C++ fit's Adam so that favor attention matches exact softmax attention on the
training sequences; the C++ fit owns the loop, the optimiser, the option checks, the
parameter sets, the lambda floor, the held-out error and its history. Objectives:

- "output": the mean squared error of the attention output against exact attention, with
  gradients from favor's own backward: all of it C++ (torch is not needed).
- "kl": the row-wise KL(exact || linear) of the attention weights, mean over query rows. C++
  has no such objective: this module gives it to the C++ fit as FitOptions::objective, a
  callback that, for the map's current parameters, returns the loss and its gradients from
  torch autograd (so it needs torch), computed in blocks of kl_block query rows (never
  N x N at once): for a block, P = softmax(scale q_blk K^T) and Q = phi(q_blk) phi(K)^T /
  row sums (lambda^2 on the keys, as favor applies it; stabilised in log space by a max per
  feature over the keys and a max per query row, which cancel). Each block is
  back-propagated as soon as it is formed; phi(K) is formed once and its gradient
  accumulated over the blocks.

What stays here: the Python API's inputs (numpy or CPU torch, [N, D] or [B, H, N, D]), the
held-out split (the count is the C++ rule, favor._core.heldout_count; B = 1 splits the
tokens, which the CLI does not offer), the starting map (favor.FeatureMap.learnable: the
CLI's draw), the KL objective, and verbose printing (the C++ fit's on_step).
"""
import sys

import numpy as np

from . import _core
from .feature_map import FeatureMap

LEARNABLE = ("weights", "bias", "lambda")
OBJECTIVES = ("output", "kl")


def _as4(x, name):
    """numpy array or CPU torch tensor [N, D] / [B, H, N, D] -> float32 numpy [B, H, N, D]."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise _core.Error(f"{name}: tensor on device '{x.device}'; fit on the CPU")
        if not x.is_floating_point():
            raise _core.Error(f"{name}: dtype {x.dtype} is not a float type")
        x = x.detach().to(torch.float32).numpy()
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise _core.Error(f"{name}: dtype {a.dtype} is not a float type")
    if a.ndim == 2:
        a = a[None, None]
    if a.ndim != 4:
        raise _core.Error(f"{name}: shape {list(a.shape)} must be [N, D] or [B, H, N, D]")
    return np.ascontiguousarray(a, dtype=np.float32)


def _split(q, k, v, heldout, holdout):
    """(train, held-out) triples: `heldout` as given, else the last `holdout` fraction
    (favor._core.heldout_count, the CLI's rule) of the batch (B >= 2) or of the tokens
    (B = 1: the last part of the sequence is its own held-out sequence)."""
    if heldout is not None:
        if not isinstance(heldout, (tuple, list)) or len(heldout) != 3:
            raise _core.Error("heldout: must be a (q, k, v) triple")
        return (q, k, v), tuple(_as4(x, f"heldout[{i}]") for i, x in enumerate(heldout))
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)):
        raise _core.Error(f"holdout: {holdout!r} must be a fraction in (0, 1) (or give heldout)")
    b = q.shape[0]
    if b >= 2:
        n = _core.heldout_count(holdout, b)
        return (q[:-n], k[:-n], v[:-n]), (q[-n:], k[-n:], v[-n:])
    hq, hk = _core.heldout_count(holdout, q.shape[2]), _core.heldout_count(holdout, k.shape[2])
    return ((q[:, :, :-hq], k[:, :, :-hk], v[:, :, :-hk]),
            (q[:, :, -hq:], k[:, :, -hk:], v[:, :, -hk:]))


def floor_lambda(lam, floor):
    """lam (a tensor of feature weights, any device) in place: each |lambda| raised to at
    least `floor` (in float32), its sign kept: the C++ rule (favor._core.floor_lambda,
    FitOptions::lambda_floor)."""
    import torch

    with torch.no_grad():
        a = lam.detach().to("cpu", torch.float32).contiguous().numpy().copy()
        _core.floor_lambda(a, floor)
        lam.copy_(torch.from_numpy(a))


def _learn_flags(learn):
    """learn (a name or names of LEARNABLE) -> the tuple of names."""
    if isinstance(learn, str):
        learn = (learn,)
    learn = tuple(learn)
    bad = [x for x in learn if x not in LEARNABLE]
    if bad or not learn:
        raise _core.Error(f"learn: {learn!r} must name one or more of " + ", ".join(LEARNABLE))
    return learn


class _Parameters:
    """The KL objective's view of the map being fitted: kernel, scale, projection and torch
    tensors W, b, lambda (the C++ fit's current sets; each learned, a constant, or None)."""

    def __init__(self, kernel, scale, projection, weights, bias, lam, learn):
        import torch

        self.kernel, self.scale = kernel, float(scale)
        self.projection = torch.from_numpy(np.array(projection, np.float32, order="C"))
        as_t = lambda a: None if a is None else torch.from_numpy(np.array(a, np.float32,
                                                                          order="C"))
        self.w, self.b, self.lam = as_t(weights), as_t(bias), as_t(lam)
        self.learned = []
        for name, t in (("weights", self.w), ("bias", self.b), ("lambda", self.lam)):
            if name in learn and t is not None:
                t.requires_grad_(True)
                self.learned.append(t)

    def grads(self):
        """The gradients of W, b, lambda as numpy arrays (None where not learned)."""
        out = []
        for t in (self.w, self.b, self.lam):
            if t is None or not t.requires_grad:
                out.append(None)
            else:
                g = t.grad
                out.append(np.zeros(t.shape, np.float32) if g is None
                           else g.detach().numpy().astype(np.float32))
        return out

    def log_features(self, x, keys):
        """log phi(x) [B, H, N, F] (positive, hyperbolic, hedgehog), lambda^2 on the keys."""
        import math

        import torch

        xs = x * math.sqrt(self.scale)
        w = self.w.unsqueeze(0) if self.w is not None else self.projection
        a = xs @ w.transpose(-1, -2)
        if self.b is not None:
            a = a + self.b[None, :, None, :]
        m = a.shape[-1]
        if self.kernel == "positive":
            log_phi = a - (xs * xs).sum(-1, keepdim=True) / 2 - 0.5 * math.log(m)
        elif self.kernel == "hyperbolic":
            log_phi = (torch.cat([a, -a], -1) - (xs * xs).sum(-1, keepdim=True) / 2
                       - 0.5 * math.log(2 * m))
        else:
            log_phi = torch.cat([a, -a], -1)
        if keys and self.lam is not None:
            lw = 2 * torch.log(torch.abs(self.lam))[None, :, None, :]
            log_phi = log_phi + (lw if log_phi.shape[-1] == m else torch.cat([lw, lw], -1))
        return log_phi


def _kl_step(params, q, k, causal, block):
    """Row-wise KL(exact || linear) of the attention weights, mean over the query rows, in
    blocks of `block` rows; back-propagates as it goes (see the module docstring)."""
    import torch

    tiny = 1e-30
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    rows = b * h * nq
    lk = params.log_features(k, keys=True)
    top = lk.detach().amax(dim=-2, keepdim=True)          # [B, H, 1, F]: max over the keys
    ek = torch.exp(lk - top)
    leaf = ek.detach().requires_grad_(True)
    total = 0.0
    for s in range(0, nq, block):
        qb = q[:, :, s:s + block]
        lq = params.log_features(qb, keys=False) + top
        eq = torch.exp(lq - lq.detach().amax(-1, keepdim=True))
        a = eq @ leaf.transpose(-1, -2)                   # [B, H, blk, Nk]
        with torch.no_grad():
            scores = (qb @ k.transpose(-1, -2)) * params.scale
            visible = None
            if causal:
                i = torch.arange(s, s + qb.shape[2])[:, None]
                visible = torch.arange(nk)[None, :] <= i
                scores = scores.masked_fill(~visible, float("-inf"))
            log_p = torch.log_softmax(scores, -1)
            p = torch.exp(log_p)
        if visible is not None:
            a = a.masked_fill(~visible, 0.0)
        log_q = torch.log(a.clamp_min(tiny)) - torch.log(a.sum(-1, keepdim=True).clamp_min(tiny))
        terms = p * (log_p - log_q)
        if visible is not None:
            terms = terms.masked_fill(~visible, 0.0)
        kl = terms.sum() / rows
        kl.backward()
        total += float(kl.detach())
    ek.backward(leaf.grad)
    return total


def _kl_objective(start, learn, q, k, causal, block):
    """FitOptions::objective for the C++ fit: (weights, bias, lambda) -> (KL, dW, db, dlambda)."""
    import torch

    tq, tk = torch.from_numpy(q), torch.from_numpy(k)
    kernel, scale, projection = start.kernel, start.resolved_scale, start.projection

    def objective(weights, bias, lam):
        params = _Parameters(kernel, scale, projection, weights, bias, lam, learn)
        loss = _kl_step(params, tq, tk, causal, block)
        return (loss, *params.grads())

    return objective


def fit_features(q, k, v, *, kernel="hedgehog", features=64, steps=200, lr=1e-2,
                 objective="output", heldout=None, holdout=0.25, causal=False, learn=LEARNABLE,
                 seed=0, kl_block=256, verbose=False, projection="orthogonal", norms="chi",
                 scale=None, start=None, eval_every=1, lambda_floor=1e-3):
    """Fits a feature map to q, k, v ([N, D] or [B, H, N, D], numpy or CPU torch; v
    [..., Dv]) by distillation against exact softmax attention; returns (favor.FeatureMap,
    history). The fit is the C++ one (favor::fit_features, as `favor fit`): the same inputs,
    options and start give the same bits.

    kernel: hedgehog (default), positive, hyperbolic or trig; features: m, the projection
    rows (drawn: kind `projection`, `norms`, `seed`, as the CLI's --projection/--norms/
    --seed); start: a favor.FeatureMap to start from instead (heads 1 or H). learn: which
    parameters to train: "weights" (W [H, m, D], from the projection), "bias" (b [H, m],
    from 0), "lambda" (the feature weights [H, m], from 1), one set per head; a start with
    learned parameters keeps its sets instead (heads = 1: one set shared by every head, the
    parameters it lacks made shared too). objective: "output" (attention-output MSE) or
    "kl" (row-wise KL of the attention weights, blockwise in kl_block query rows, with torch
    autograd; not for trig). heldout=(q, k, v) held-out sequences, else the last `holdout`
    fraction of the batch (B >= 2) or of the tokens (B = 1) is held out (the CLI's
    --holdout count). causal: fit causal attention. Adam with step size lr for `steps`
    steps. lambda_floor: feature weights must stay nonzero, so after every step each
    |lambda_f| is raised to at least this, its sign kept (FitOptions::lambda_floor; only
    ratios of lambda^2 matter, and a weight at 1e-3 leaves its feature 1e-6 of the weight
    of one at 1: practically off, still invertible). The option checks are the C++ fit's.

    history: one dict per evaluated step (step 0 = the starting map; every eval_every steps
    and the last): step, loss (the training loss at that step's map), heldout_error
    (relative Frobenius error of favor attention against exact attention on the held-out
    sequences), seconds (since the fit began). verbose prints the settings (seeds included)
    and every evaluated step. The map's scale is the resolved one (1/sqrt(D) by default).
    """
    if objective not in OBJECTIVES:
        raise _core.Error(f"objective: '{objective}' must be 'output' or 'kl'")
    learn = _learn_flags(learn)
    if isinstance(kl_block, bool) or not isinstance(kl_block, int) or kl_block < 1:
        raise _core.Error(f"kl_block: {kl_block!r} must be an integer >= 1")
    q, k, v = _as4(q, "q"), _as4(k, "k"), _as4(v, "v")
    drawn = start is None
    if drawn:  # no sets: the C++ fit gives it one per head
        start = FeatureMap.learnable(kernel, features, q.shape[3], seed=seed,
                                     projection=projection, norms=norms, scale=scale,
                                     weights=False, bias=False, lambda_=False)
    elif not isinstance(start, FeatureMap):
        raise _core.Error(f"start: must be a favor.FeatureMap, not {type(start).__name__}")
    if objective == "kl" and start.kernel == "trig":
        raise _core.Error("objective: 'kl' needs positive attention weights; the trig kernel's "
                          "can be negative (use objective='output')")
    (tq, tk, tv), (hq, hk, hv) = _split(q, k, v, heldout, holdout)
    if verbose:
        print(f"favor.fit_features: kernel={start.kernel} m={start.m} D={tq.shape[3]} "
              f"heads={tq.shape[1]} objective={objective} learn={','.join(learn)} "
              f"steps={steps} lr={lr} causal={causal} "
              f"projection={projection if drawn else 'start'} lambda_floor={lambda_floor:g} "
              f"norms={norms} seed={seed} scale={start.resolved_scale:.6g}; "
              f"train {list(tq.shape)}, held out {list(hq.shape)}", flush=True)

    def report(s):
        print(f"step {s['step']:5d}  loss {s['loss']:.6g}  heldout_error "
              f"{s['heldout_error']:.6f}  {s['seconds']:.2f}s", flush=True)

    fitted, history = _core.fit_features(
        tq, tk, tv, hq, hk, hv, start.core(), steps=steps, lr=lr, causal=bool(causal),
        learn_weights="weights" in learn, learn_bias="bias" in learn,
        learn_lambda="lambda" in learn, lambda_floor=lambda_floor, eval_every=eval_every,
        seed=seed, on_step=report if verbose else None,
        objective=_kl_objective(start, learn, tq, tk, causal, kl_block)
        if objective == "kl" else None)
    return FeatureMap(start.projection.copy(), kernel=fitted.kernel, scale=start.resolved_scale,
                      heads=fitted.heads, weights=fitted.weights, bias=fitted.bias,
                      lambda_=fitted.lambda_), history


def clustered_qkv(b, h, n, d, seed, clusters=4, noise=0.5, spread=1.5):
    """Synthetic attention data with structure, for trying fit_features: per head, queries and
    keys lie around `clusters` shared centres (N(0, spread^2) each) with N(0, noise^2) offsets,
    so attention is sharp and data-dependent (the case where random features estimate it
    poorly and a fitted map pays off); v is N(0, 1). Returns float32 numpy q, k, v
    [B, H, N, D], the same for the same arguments."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((h, clusters, d)) * spread
    z = rng.integers(0, clusters, (b, h, n))
    base = centres[np.arange(h)[None, :, None], z]
    q = base + noise * rng.standard_normal((b, h, n, d))
    k = base + noise * rng.standard_normal((b, h, n, d))
    v = rng.standard_normal((b, h, n, d))
    return tuple(x.astype(np.float32) for x in (q, k, v))
