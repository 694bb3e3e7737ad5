"""The canonical map: favor's feature maps in the one form every device-generic kernel reads
(the torch path, generic.py; the Triton kernels, triton/), the form the C++ kernels read
(src/kernels/feature_params.hpp):

    a_f(x) = W_f . x + bias_f                       (W carries sqrt(scale))
    key j:  g_j = norm_coef |k_j|^2 + j rate        (rate = -log gamma: causal decay)
            EXP     l_jf = a_f(k_j) + g_j + key_logw_f                 F = m
            EXP_PM  l_jf = +-a_f(k_j) + g_j + key_logw_f               F = 2m
            TRIG    l_jf = g_j + key_logw_f, amplitude [sin a, cos a]  F = 2m
    query:  EXP / EXP_PM: +-a_f(q_i) (shifted by the row's c_i); TRIG: [sin a, cos a]

key_logw = log lambda^2 (learned feature weights enter phi(q).phi(k) as lambda^2, all on the
keys); constant factors (m^-1/2, FAVOR++'s prod (1-4A)^(1/4)) and the query's norm term are
common to a row and cancel in the ratio, so they are never formed. FAVOR++ / FAVOR# fold the
fit into W and bias (W_f = Q diag(sqrt(1-4A)) w_f, bias_f = sum_l A_l w_fl^2). Everything here
is torch operations on the parameters, so gradients reach w, weights, bias, lambda and gamma.

The rules about values (finite parameters, nonzero lambda, a fit for the kernel, the scale,
gamma in (0, 1], one or H gammas, causal only) are C++'s: check_map builds the C++ map from
host copies of the (small) parameters and runs it on one zero token, so every device gets
the same errors (eager calls; a graph being traced by torch.compile cannot read values).
"""
from collections import namedtuple

import numpy as np
import torch

from ... import _core
from .layout import decay_list, feature_map

EXP, EXP_PM, TRIG = 0, 1, 2
_FORMS = {"exp": EXP, "exp_pm": EXP_PM, "trig": TRIG}
# C++'s form of every kernel (favor::kernel_form: the canonical name, form, key norm), read
# once (traceable)
_KERNELS = {name: _core.kernel_form(name) for name, _ in _core.kernel_names()}

CanonicalMap = namedtuple("CanonicalMap", "kind W bias key_logw rate norm_coef")
CanonicalMap.__doc__ = """kind (EXP, EXP_PM, TRIG); W [w_sets, m, D] float32 (sqrt(scale)
folded in); bias [b_sets, m] or None; key_logw [l_sets, m] (log lambda^2) or None; rate
[r_sets] float64 (-log gamma) or None; norm_coef a float (-scale/2, +scale/2 or 0)."""


def kind_of(kernel):
    """(canonical name by C++'s parser, kind, key norm coefficient) of a kernel name."""
    form = _KERNELS.get(kernel) if isinstance(kernel, str) else None
    if form is None:
        form = _core.kernel_form(kernel)  # raises C++'s error naming the kernels
    name, shape, key_norm = form
    return name, _FORMS[shape], key_norm


def _host(t):
    return None if t is None else t.detach().to("cpu", torch.float32)


def check_map(w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale, batch, heads,
              causal):
    """Raises favor.Error for what the C++ library refuses in these parameters (their
    values included), by building its map from host copies: one rule, one place. Skipped
    while torch.compile traces (values are not known there)."""
    if torch.compiler.is_compiling():
        return
    fm = feature_map(_host(w), _host(weights), _host(bias), _host(lam),
                     None if fit_a is None else fit_a.detach().cpu(),
                     None if fit_basis is None else fit_basis.detach().cpu(), kernel, scale)
    # the C++ attention on one zero token of this batch and these heads resolves the map:
    # the scale, the parameter and fit sets against B and H, gamma, its count, causal only
    one = np.zeros((batch, heads, 1, fm.projection.d), np.float32)
    _core.attention_map(one, one, one[..., :1], fm, causal=causal, decay=decay_list(decay))


def canonical_map(w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale, d):
    """The CanonicalMap of favor::attention's tensors (see the module docstring): w [m, D]
    the projection (unused when per-head weights [sets, m, D] are given), bias and lam
    [sets, m], decay gamma [1] / [H], a fit (a [sets, D], basis [sets, D, D]), on q's
    device, differentiable in every learned tensor."""
    _, kind, key_norm = kind_of(kernel)
    s = (1.0 / d ** 0.5) if scale is None else float(scale)
    root = s ** 0.5
    base = weights if weights is not None else w.unsqueeze(0)
    b = bias
    if fit_a is not None:  # FAVOR++ / FAVOR#: the fit's directions and log bias
        a = fit_a.to(base.device, torch.float32)
        basis = fit_basis.to(base.device, torch.float32)
        base = torch.einsum("sdl,sl,fl->sfd", basis, torch.sqrt(1 - 4 * a), w)
        b = torch.einsum("sl,fl->sf", a, w * w)
    key_logw = None if lam is None else 2 * torch.log(torch.abs(lam))
    rate = None if decay is None else -torch.log(decay.to(torch.float64)).reshape(-1)
    return CanonicalMap(kind, base * root, b, key_logw, rate, key_norm * s)


def per_head(t, bh):
    """A parameter with `sets` entries along axis 0 (head bh uses set bh % sets) expanded
    to [bh, ...] (a view when sets is 1)."""
    sets = t.shape[0]
    if sets == bh:
        return t
    if sets == 1:
        return t.expand(bh, *t.shape[1:])
    return t.repeat(bh // sets, *([1] * (t.dim() - 1)))
