"""favor.fit_features: a feature map fitted to data by distillation (Hedgehog; DiJiang's WPFF
weights), in PyTorch (imported on first use: `import favor` does not need torch).

The map's learned parameters (per-head projections W, biases b, feature weights lambda) are
trained with torch.optim.Adam so that favor attention matches exact softmax attention on the
training sequences. Objectives:

- "output": the mean squared error of the attention output against exact attention; the
  gradients come from favor's own backward (favor.torch's autograd function).
- "kl": the row-wise KL(exact || linear) of the attention weights, mean over query rows,
  computed in blocks of kl_block query rows with torch ops (never N x N at once): for a
  block, P = softmax(scale q_blk K^T) and Q = phi(q_blk) phi(K)^T / row sums (lambda^2 on
  the keys, as favor applies it; stabilised in log space by a max per feature over the keys
  and a max per query row, which cancel). Each block is back-propagated as soon as it is
  formed; phi(K) is formed once and its gradient accumulated over the blocks.

Every step records the training loss and the held-out relative error |y - y_exact|_F /
|y_exact|_F of favor attention with the current map. As the C++ fit (favor::fit_features):
after every step each |lambda_f| is raised to at least lambda_floor (sign kept), and the
fitted map keeps the start's parameter sets (1 or H; H without a start or learned parameters).
"""
import math
import time

import numpy as np

from . import _core
from ._args import KERNELS
from .api import exact_attention
from .feature_map import FeatureMap

LEARNABLE = ("weights", "bias", "lambda")
OBJECTIVES = ("output", "kl")
FITTABLE = tuple(k for k in KERNELS if not _core.data_adapted(k))  # not favorpp, favorsharp


def _as4(x, name):
    """numpy array or torch tensor [N, D] / [B, H, N, D] -> float32 torch [B, H, N, D]."""
    import torch

    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.device.type != "cpu":
            raise _core.Error(f"{name}: tensor on device '{t.device}'; fit on the CPU")
    else:
        a = np.asarray(x)
        if a.dtype.kind != "f":
            raise _core.Error(f"{name}: dtype {a.dtype} is not a float type")
        t = torch.from_numpy(np.ascontiguousarray(a))
    if not t.is_floating_point():
        raise _core.Error(f"{name}: dtype {t.dtype} is not a float type")
    if t.dim() == 2:
        t = t[None, None]
    if t.dim() != 4:
        raise _core.Error(f"{name}: shape {list(t.shape)} must be [N, D] or [B, H, N, D]")
    return t.to(torch.float32).contiguous()


def _split(q, k, v, heldout, holdout):
    """(train, held-out) triples: `heldout` as given, else the last `holdout` fraction of the
    batch (B >= 2) or of the tokens (B = 1: the last part of the sequence is its own
    held-out sequence)."""
    if heldout is not None:
        if not isinstance(heldout, (tuple, list)) or len(heldout) != 3:
            raise _core.Error("heldout: must be a (q, k, v) triple")
        return (q, k, v), tuple(_as4(x, f"heldout[{i}]") for i, x in enumerate(heldout))
    if not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
        raise _core.Error(f"holdout: {holdout!r} must be a fraction in (0, 1) (or give heldout)")
    b = q.shape[0]
    if b >= 2:
        n = min(max(1, round(holdout * b)), b - 1)
        return (q[:-n], k[:-n], v[:-n]), (q[-n:], k[-n:], v[-n:])
    nq, nk = q.shape[2], k.shape[2]
    hq, hk = max(1, round(holdout * nq)), max(1, round(holdout * nk))
    if hq >= nq or hk >= nk:
        raise _core.Error(f"holdout: {holdout} of {nq} tokens leaves none to train on")
    return ((q[:, :, :-hq], k[:, :, :-hk], v[:, :, :-hk]),
            (q[:, :, -hq:], k[:, :, -hk:], v[:, :, -hk:]))


def floor_lambda(lam, floor):
    """lam (a tensor of feature weights) in place: each |lambda| raised to at least `floor`
    (in float32), its sign kept (C++ copysign; FitOptions::lambda_floor)."""
    import torch

    with torch.no_grad():
        f = torch.full_like(lam, floor)
        lam.copy_(torch.where(lam.abs() < f, torch.copysign(f, lam), lam))


def _check(kernel, features, steps, lr, objective, learn, kl_block, lambda_floor):
    if kernel not in FITTABLE:
        raise _core.Error(f"kernel: '{kernel}' cannot be fitted; use one of " + ", ".join(FITTABLE)
                          + " (favorpp / favorsharp take their parameters from a KernelFit)")
    if objective not in OBJECTIVES:
        raise _core.Error(f"objective: '{objective}' must be 'output' or 'kl'")
    if objective == "kl" and kernel == "trig":
        raise _core.Error("objective: 'kl' needs positive attention weights; the trig kernel's "
                          "can be negative (use objective='output')")
    if isinstance(learn, str):
        learn = (learn,)
    learn = tuple(learn)
    bad = [x for x in learn if x not in LEARNABLE]
    if bad or not learn:
        raise _core.Error(f"learn: {learn!r} must name one or more of " + ", ".join(LEARNABLE))
    for name, value, low in (("features", features, 1), ("steps", steps, 0),
                             ("kl_block", kl_block, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise _core.Error(f"{name}: {value!r} must be an integer >= {low}")
    if not isinstance(lr, (int, float)) or not lr > 0:
        raise _core.Error(f"lr: {lr!r} must be > 0")
    if (isinstance(lambda_floor, bool) or not isinstance(lambda_floor, (int, float))
            or not (math.isfinite(lambda_floor) and lambda_floor > 0)):
        raise _core.Error(f"lambda_floor: {lambda_floor!r} must be finite and > 0")
    return learn


def _start_map(start, kernel, features, d, heads, seed, projection, norms, scale):
    if start is None:
        return FeatureMap.learnable(kernel, features, d, heads=heads, seed=seed,
                                    projection=projection, norms=norms, scale=scale,
                                    weights=False, bias=False, lambda_=False)
    if not isinstance(start, FeatureMap):
        raise _core.Error(f"start: must be a favor.FeatureMap, not {type(start).__name__}")
    if start.d != d:
        raise _core.Error(f"start: has d = {start.d}, the data have D = {d}")
    if start.heads not in (1, heads):
        raise _core.Error(f"start: heads = {start.heads} must be 1 or H = {heads}")
    if start.kernel not in FITTABLE:
        raise _core.Error(f"start: a {start.kernel} map cannot be fitted")
    return start


class _Parameters:
    """The map being fitted: base projection, kernel, scale and tensors W, b, lambda with one
    set per head, or the start's single shared set (each learned, a constant, or None)."""

    def __init__(self, start, heads, learn):
        import torch

        # As the C++ FeatureMap::learnable in favor::fit_features: a start with learned
        # parameters keeps its 1 or H sets (the ones it lacks are made with as many), one
        # without gets a set per head.
        heads = start.heads if start.learned else heads
        self.start, self.heads = start, heads
        self.kernel, self.scale = start.kernel, start.resolved_scale
        self.projection = _core.Projection.from_matrix(start.projection)

        def per_head(a, default):
            if a is None:
                if default is None:
                    return None
                a = default
            a = np.array(a, dtype=np.float32, order="C")  # a copy: the start stays as given
            return torch.from_numpy(np.repeat(a, heads, axis=0) if a.shape[0] == 1 else a)

        m = start.m
        self.w = per_head(start.weights, start.projection[None] if "weights" in learn else None)
        self.b = per_head(start.bias, np.zeros((1, m), np.float32) if "bias" in learn else None)
        ones = np.ones((1, m), np.float32)
        self.lam = per_head(start.lambda_, ones if "lambda" in learn else None)
        self.learned = []
        for name, t in (("weights", self.w), ("bias", self.b), ("lambda", self.lam)):
            if name in learn:
                t.requires_grad_(True)
                self.learned.append(t)

    def floor_lambda(self, floor):
        floor_lambda(self.lam, floor)

    def attention(self, q, k, v, causal):
        from .torch.function import attention

        return attention(q, k, v, causal=causal, kernel=self.kernel, projection=self.projection,
                         scale=self.scale, weights=self.w, bias=self.b, feature_weights=self.lam)

    def log_features(self, x, keys):
        """log phi(x) [B, H, N, F] (positive, hyperbolic, hedgehog), lambda^2 on the keys."""
        import torch

        xs = x * math.sqrt(self.scale)
        w = self.w.unsqueeze(0) if self.w is not None else torch.from_numpy(
            np.ascontiguousarray(self.start.projection))
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

    def feature_map(self):
        arr = lambda t: None if t is None else t.detach().numpy().copy()
        return FeatureMap(self.start.projection.copy(), kernel=self.kernel, scale=self.scale,
                          heads=self.heads, weights=arr(self.w), bias=arr(self.b),
                          lambda_=arr(self.lam))


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
        total += float(kl)
    ek.backward(leaf.grad)
    return total


def fit_features(q, k, v, *, kernel="hedgehog", features=64, steps=200, lr=1e-2,
                 objective="output", heldout=None, holdout=0.25, causal=False, learn=LEARNABLE,
                 seed=0, kl_block=256, verbose=False, projection="orthogonal", norms="chi",
                 scale=None, start=None, eval_every=1, lambda_floor=1e-3):
    """Fits a feature map to q, k, v ([N, D] or [B, H, N, D], numpy or torch; v [..., Dv])
    by distillation against exact softmax attention; returns (favor.FeatureMap, history).

    kernel: hedgehog (default), positive, hyperbolic or trig; features: m, the projection
    rows (drawn: kind `projection`, `norms`, `seed`, as the CLI's --projection/--norms/
    --seed); start: a favor.FeatureMap to start from instead (heads 1 or H). learn: which
    parameters to train: "weights" (W [H, m, D], from the projection), "bias" (b [H, m],
    from 0), "lambda" (the feature weights [H, m], from 1), one set per head; a start with
    learned parameters keeps its sets instead (heads = 1: one set shared by every head, the
    parameters it lacks made shared too), as the C++ fit. objective: "output"
    (attention-output MSE) or "kl" (row-wise KL of the attention weights, blockwise in
    kl_block query rows). heldout=(q, k, v) held-out sequences, else the last `holdout`
    fraction of the batch (B >= 2) or of the tokens (B = 1) is held out. causal: fit causal
    attention. Adam with step size lr for `steps` steps. lambda_floor: feature weights must
    stay nonzero, so after every step each |lambda_f| is raised to at least this, its sign
    kept (the C++ FitOptions::lambda_floor; only ratios of lambda^2 matter, and a weight at
    1e-3 leaves its feature 1e-6 of the weight of one at 1: practically off, still
    invertible).

    history: one dict per evaluated step (step 0 = the starting map; every eval_every steps
    and the last): step, loss (the training loss at that step's map), heldout_error
    (relative Frobenius error of favor attention against exact attention on the held-out
    sequences), seconds (since the fit began). verbose prints the settings (seeds included)
    and every evaluated step. The map's scale is the resolved one (1/sqrt(D) by default).
    """
    import torch

    learn = _check(kernel if start is None else getattr(start, "kernel", kernel), features,
                   steps, lr, objective, learn, kl_block, lambda_floor)
    if isinstance(eval_every, bool) or not isinstance(eval_every, int) or eval_every < 0:
        raise _core.Error(f"eval_every: {eval_every!r} must be an integer >= 0")
    q, k, v = _as4(q, "q"), _as4(k, "k"), _as4(v, "v")
    (tq, tk, tv), (hq, hk, hv) = _split(q, k, v, heldout, holdout)
    heads, d = tq.shape[1], tq.shape[3]
    if hq.shape[1] != heads or hq.shape[3] != d or hv.shape[3] != tv.shape[3]:
        raise _core.Error(f"heldout: shapes {list(hq.shape)}, {list(hv.shape)} must share H, D "
                          "and Dv with the training data")
    fm = _start_map(start, kernel, features, d, heads, seed, projection, norms, scale)
    params = _Parameters(fm, heads, learn)
    exact = lambda a, b, c: torch.from_numpy(exact_attention(
        a.numpy(), b.numpy(), c.numpy(), causal=causal, scale=params.scale))
    target, held_target = exact(tq, tk, tv), exact(hq, hk, hv)
    held_norm = float(torch.linalg.norm(held_target.double()))
    if verbose:
        print(f"favor.fit_features: kernel={params.kernel} m={fm.m} D={d} heads={heads} "
              f"objective={objective} learn={','.join(learn)} steps={steps} lr={lr} "
              f"causal={causal} projection={projection if start is None else 'start'} "
              f"sets={params.heads} lambda_floor={lambda_floor:g} "
              f"norms={norms} seed={seed} scale={params.scale:.6g}; train {list(tq.shape)}, "
              f"held out {list(hq.shape)}", flush=True)
    optimiser = torch.optim.Adam(params.learned, lr=lr)
    history = []
    began = time.perf_counter()
    for step in range(steps + 1):
        optimiser.zero_grad()
        if objective == "output":
            y = params.attention(tq, tk, tv, causal)
            loss_t = ((y - target) ** 2).mean()
            loss_t.backward()
            loss = float(loss_t)
        else:
            loss = _kl_step(params, tq, tk, causal, kl_block)
        if not math.isfinite(loss):
            raise _core.Error(f"lr: the loss is {loss} at step {step}; lower the step size")
        last = step == steps
        if step == 0 or last or (eval_every and step % eval_every == 0):
            with torch.no_grad():
                err = float(torch.linalg.norm((params.attention(hq, hk, hv, causal)
                                               - held_target).double())) / held_norm
            record = dict(step=step, loss=loss, heldout_error=err,
                          seconds=time.perf_counter() - began)
            history.append(record)
            if verbose:
                print(f"step {step:5d}  loss {loss:.6g}  heldout_error {err:.6f}  "
                      f"{record['seconds']:.2f}s", flush=True)
        if not last:
            optimiser.step()
            if "lambda" in learn:
                params.floor_lambda(lambda_floor)
    return params.feature_map(), history


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
