"""The oracle of favor::exact_attention: softmax(scale q k^T) v, the textbook formula in plain
torch operations (any dtype, differentiable by autograd)."""
import math

import torch


def softmax_attention(q, k, v, causal=False, scale=None, keep=None):
    """softmax(scale q k^T) v, materialising the N x N scores; keep [B, Nk] False drops a key
    (q, k, v [B, H, N, D]); a row with no visible key is zeros, as favor defines it."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * s
    if keep is not None:
        scores = scores.masked_fill(~torch.as_tensor(keep, dtype=torch.bool)[:, None, None, :],
                                    float("-inf"))
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    if keep is None:
        return torch.softmax(scores, -1) @ v
    seen = torch.isfinite(scores).any(-1, keepdim=True)
    p = torch.softmax(scores.masked_fill(~seen, 0.0), -1) * seen
    return p @ v
