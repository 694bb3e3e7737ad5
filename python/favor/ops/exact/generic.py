"""favor::exact_attention's torch path (any device): softmax(scale q k^T) v by torch's
scaled_dot_product_attention (flash / memory-efficient / cuDNN kernels where the device has
them), with favor's rule for rows that see no key: zeros (SDPA would give NaN), with finite
gradients (such a row attends to every key inside SDPA, and its output is then zeroed)."""
import math

import torch
import torch.nn.functional as F


def exact_attention(q, k, v, keep, causal, scale):
    """y [.., Nq, Dv] float32 for float32 q, k [.., N, D], v [.., Nk, Dv]; keep [B, Nk] bool
    (True = the key takes part) or None."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if keep is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=s)
    nq, nk = q.shape[-2], k.shape[-2]
    visible = keep.to(q.device)[:, None, None, :] if q.dim() == 4 else keep.to(q.device)
    if causal:
        visible = visible & torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril()
    seen = visible.any(-1, keepdim=True)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=visible | ~seen, scale=s)
    return torch.where(seen, y, torch.zeros_like(y))
