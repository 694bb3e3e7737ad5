"""favor::vq_attention's torch path (any device): Transformer-VQ as linear attention over the
codebook, in plain torch operations (math.md s.6). Quantised keys make attention exactly
linear: exp(s q_i.C_(z_j)) is the query's feature of code z_j, so with key features
p_j = onehot(z_j) (hard VQ) or p(s|k_j) = softmax_s(-|k_j - C_s|^2 / tau) (soft VQ) the
output is phi(q_i) [S | s] / phi(q_i) s, computed by favor's linear core (bidirectional or
chunked causal, the query shift of docs/numerics.md, rows with no key zeros).

Gradients by autograd: soft VQ exact; hard VQ straight-through (dk = dL/dk^), as favor's C++
backward: each key carries delta_j = k_j - sg(k_j) (zero in value), exp(s q_i.(C_z + delta_j))
is linearised as exp(s q_i.C_z) (1 + s q_i.delta_j), exact in value and first derivative, and
delta rides in the values: [v_j | 1] (x) [1 | delta_j] (width (Dv + 1)(D + 1), only when k
requires grad). `block` changes only the C++ evaluation order and is not used here.
"""
import math

import numpy as np
import torch

from ... import _core
from ..attention import generic
from ..attention.paths import check_inputs, flat, keep_rows


def check(q, codebook, tau, causal, block, scale):
    """C++'s checks of the codebook (shape, values) and tau, by a one-token call on host
    copies: one rule, one place (eager calls; skipped while torch.compile traces)."""
    if torch.compiler.is_compiling():
        return
    heads, d = (q.shape[1] if q.dim() == 4 else 1), q.shape[-1]
    one = np.zeros((1, heads, 1, d), np.float32)
    cb = np.ascontiguousarray(codebook.detach().to("cpu", torch.float32).numpy())
    _core.vq_attention(one, one, one, cb, causal=causal, tau=tau, block=block, scale=scale)


def vq_attention(q, k, v, codebook, key_padding_mask, causal, scale, tau, block, chunk=64):
    """y [.., Nq, Dv] float32 for float32 q, k, v, codebook [c, D] or [H or 1, c, D]."""
    check_inputs(q, k, v, causal, key_padding_mask)
    check(q, codebook, tau, causal, block, scale)
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qf, kf, vf = flat(q), flat(k), flat(v)
    bh = qf.shape[0]
    cb = codebook.to(q.device, torch.float32)
    cb = cb if cb.dim() == 3 else cb.unsqueeze(0)
    cb = cb.repeat(bh // cb.shape[0], 1, 1) if cb.shape[0] != bh else cb     # [BH, c, D]
    lq = s * (qf @ cb.transpose(-1, -2))                                      # [BH, Nq, c]
    dist = _distances(kf, cb)
    straight = tau == 0 and k.requires_grad
    if tau == 0:
        phi = torch.nn.functional.one_hot(dist.argmin(-1), cb.shape[1]).to(torch.float32)
    else:
        phi = torch.softmax(-dist / tau, -1)
    keep = keep_rows(key_padding_mask, q)
    if keep is not None:
        phi = phi * keep.unsqueeze(-1).to(phi.dtype)
    scales = torch.zeros(phi.shape[:2], dtype=torch.float64, device=q.device)
    dv = vf.shape[-1]
    vx = torch.cat([vf, torch.ones_like(vf[..., :1])], -1)                   # [BH, Nk, Dv + 1]
    if not straight:
        out = generic.linear_core(lq, True, phi, scales, vx, causal, dv, chunk)
    else:
        delta = kf - kf.detach()
        ext = torch.cat([torch.ones_like(delta[..., :1]), delta], -1)        # [BH, Nk, D + 1]
        wide = (ext.unsqueeze(-1) * vx.unsqueeze(-2)).flatten(-2)            # [.., (D+1)(Dv+1)]
        out = generic.linear_core(lq, True, phi, scales, wide, causal, dv, chunk)
        out = out.unflatten(-1, (ext.shape[-1], dv + 1))
        qx = torch.cat([torch.ones_like(qf[..., :1]), s * qf], -1)           # [BH, Nq, D + 1]
        out = (qx.unsqueeze(-1) * out).sum(-2)
    return generic.ratio(out, dv).reshape(*q.shape[:-1], dv)


def _distances(k, cb):
    """|k_j - C_s|^2 [BH, N, c] for k [BH, N, D], cb [BH, c, D] (expanded: exact, as the
    C++ assignment's nearest code up to ties)."""
    return (k * k).sum(-1, keepdim=True) - 2 * k @ cb.transpose(-1, -2) \
        + (cb * cb).sum(-1).unsqueeze(1)
