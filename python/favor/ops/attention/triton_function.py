"""favor.torch.attention's 'triton' path: the fused Triton kernels (triton/) as one autograd
function on the canonical map (canonical.py), and the fused decode step.

The forward saves q, k, v, y and the map; the backward is the fused backward kernel, which
recomputes the states in fp32 (triton/gradients.py). Gradients reach the canonical W, bias,
key_logw and rate, and from there, by autograd through canonical_map, the caller's
projection, weights, bias, lambda and gamma.

Precision of the dots: torch's own switch for fp32 matmuls decides, as for torch.matmul:
torch.backends.cuda.matmul.allow_tf32 False (torch's default) -> exact fp32 ('ieee'), True
-> 'tf32'. Under the interpreter (CPU tensors) dots are exact fp32 either way.
"""
import torch

from ... import _core

# What the fused kernels cover (backward: one padded block for D and for Dv).
HEAD_DIMS = (16, 32, 64, 128)
MAX_DV = 256


def supported(d, dv):
    """True when the fused kernels (forward and backward) take head dim d and value dim dv."""
    return d in HEAD_DIMS and dv <= MAX_DV


def precision():
    """tl.dot's input precision for fp32 operands, from torch's matmul switch."""
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _kernels():
    from . import triton as kernels  # imports triton: only when this path runs
    return kernels


class _FusedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, W, bias, key_logw, rate, keep, kind, norm_coef, causal, heads):
        kernels = _kernels()
        prec = precision()
        y = kernels.forward(q, k, v, W, bias, key_logw, rate, norm_coef, kind, causal, keep,
                            heads, precision=prec)
        ctx.save_for_backward(q, k, v, y, W, bias, key_logw, rate, keep)
        ctx.options = (kind, norm_coef, causal, heads, prec)
        return y

    @staticmethod
    def backward(ctx, dy):
        q, k, v, y, W, bias, key_logw, rate, keep = ctx.saved_tensors
        kind, norm_coef, causal, heads, prec = ctx.options
        need = ctx.needs_input_grad
        dq, dk, dv, dW, db, dlw, dr = _kernels().backward(
            dy.contiguous(), q, k, v, y, W, bias, key_logw, rate, norm_coef, kind, causal, keep,
            heads, precision=prec, need_params=any(need[3:7]))
        pick = lambda i, g: g if need[i] else None
        return (pick(0, dq), pick(1, dk), pick(2, dv), pick(3, dW), pick(4, db), pick(5, dlw),
                pick(6, dr), None, None, None, None, None)


def _f32(t):
    return None if t is None else t.to(torch.float32).contiguous()


def triton_attention(q, k, v, cm, keep, causal, heads):
    """y [BH, Nq, Dv] float32 for q, k, v [BH, N, D] float32 under the CanonicalMap cm
    (keep [BH, Nk] bool or None), through the fused kernels."""
    d, dv = q.shape[-1], v.shape[-1]
    if not supported(d, dv):
        raise _core.Error(f"backend: 'triton' takes head dims D in {HEAD_DIMS} and Dv <= "
                          f"{MAX_DV}; got D = {d}, Dv = {dv} (use backend='torch')")
    keep_b = None if keep is None else keep[::heads].contiguous()          # [B, Nk]
    return _FusedAttention.apply(q.contiguous(), k.contiguous(), v.contiguous(), _f32(cm.W),
                                 _f32(cm.bias), _f32(cm.key_logw), _f32(cm.rate), keep_b,
                                 cm.kind, float(cm.norm_coef), bool(causal), heads)


def triton_decode_step(state, q, k, v, cm, key_mask):
    """favor::decode_step for one token (q, k, v [B, H, 1, D or Dv]) by the fused append +
    query kernel, on the C++ Decoder's state layout: (y [B, H, 1, Dv], new state)."""
    sums, log_max, row_positions, position = state
    b, h = q.shape[:2]
    flat = lambda t: t.reshape(b * h, *t.shape[2:]).contiguous()
    keep = None if key_mask is None else key_mask.to(q.device).ne(0).reshape(b, 1)
    with torch.no_grad():
        y, s2, m2, r2, p2 = _kernels().decode_step(
            flat(sums), flat(log_max), row_positions.contiguous(), int(position[0]), flat(q),
            flat(k), flat(v), _f32(cm.W), _f32(cm.bias), _f32(cm.key_logw), _f32(cm.rate),
            float(cm.norm_coef), cm.kind, keep, h, precision=precision())
    position = torch.as_tensor([int(p2)], dtype=torch.int64, device=q.device) \
        if not isinstance(p2, torch.Tensor) else p2.reshape(1)
    return y.reshape(b, h, 1, -1).float(), (s2.reshape(sums.shape), m2.reshape(log_max.shape),
                                           r2, position)
