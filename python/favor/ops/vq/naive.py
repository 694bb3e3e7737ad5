"""The oracle of favor::vq_attention: Transformer-VQ materialised in plain torch operations,
hard (straight-through) and soft (vq_quantise, vq_distances, vq_attention_materialised)."""
import math

import torch


def _codebook4(codebook):
    """[c, D] or [H, c, D] -> [1, H or 1, c, D]."""
    return (codebook if codebook.dim() == 3 else codebook.unsqueeze(0)).unsqueeze(0)


def vq_distances(k, codebook):
    """|k_j - C_s|^2 for keys k [B, H, N, D] and a codebook [c, D] or [H, c, D]: [B, H, N, c]
    (the differences are formed explicitly: exact in any dtype, small inputs only)."""
    c = _codebook4(codebook)
    return ((k.unsqueeze(-2) - c.unsqueeze(2)) ** 2).sum(-1)


def vq_quantise(k, codebook):
    """(k^, z): the nearest code of every key, z [B, H, N] (ties to the lowest index), and
    k^ = C_z [B, H, N, D], differentiable with respect to the codebook only."""
    with torch.no_grad():
        z = vq_distances(k, codebook).argmin(-1)
    c = _codebook4(codebook).expand(k.shape[0], k.shape[1], -1, -1)
    return torch.gather(c, 2, z.unsqueeze(-1).expand(*z.shape, k.shape[-1])), z


def vq_attention_materialised(q, k, v, codebook, causal=False, scale=None, keep=None, tau=0.0):
    """Transformer-VQ attention materialised (math.md s.6), the float64 oracle of the tests.

    Hard VQ (tau = 0): softmax(scale q.k^) v over the quantised keys k^ = C_z, written as
    k^ + (k - sg(k)) so that autograd gives k the straight-through gradient dL/dk^ and the
    codebook dL/dC through k^. Soft VQ (tau > 0): A_ij = sum_s exp(scale q_i.C_s) p(s|k_j),
    p(s|k) = softmax_s(-|k - C_s|^2 / tau), y = A V / A 1 (through log A, stable).
    keep [B, Nk] False drops a key; rows with no visible key are zeros."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if tau == 0:
        khat, _ = vq_quantise(k, codebook)
        logits = s * (q @ (khat + (k - k.detach())).transpose(-1, -2))
    else:
        log_p = torch.log_softmax(-vq_distances(k, codebook) / tau, -1)      # [B, H, Nk, c]
        qc = s * (q @ _codebook4(codebook).transpose(-1, -2))                 # [B, H, Nq, c]
        logits = torch.logsumexp(qc.unsqueeze(3) + log_p.unsqueeze(2), -1)    # [B, H, Nq, Nk]
    nq, nk = logits.shape[-2:]
    visible = torch.ones(logits.shape[0], 1, nq, nk, dtype=torch.bool)
    if keep is not None:
        visible = visible & torch.as_tensor(keep, dtype=torch.bool)[:, None, None, :]
    if causal:
        visible = visible & torch.ones(nq, nk, dtype=torch.bool).tril()
    seen = visible.any(-1, keepdim=True)
    logits = torch.where(visible, logits, torch.full_like(logits, float("-inf")))
    logits = torch.where(seen, logits, torch.zeros_like(logits))   # all-masked rows: finite
    p = torch.where(visible, torch.softmax(logits, -1), torch.zeros_like(logits))
    return torch.where(seen, p @ v, torch.zeros(1, dtype=v.dtype))
