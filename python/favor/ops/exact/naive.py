"""The oracle of favor::exact_attention: softmax(scale q k^T) v, the textbook formula in plain
torch operations (any dtype, differentiable by autograd)."""
import math

import torch


def softmax_attention(q, k, v, causal=False, scale=None):
    """softmax(scale q k^T) v, materialising the N x N scores."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * s
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, -1) @ v
