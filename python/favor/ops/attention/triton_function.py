"""What the fused Triton kernels (triton/) take and how they compute: the head dims they cover,
the precision of their dots, and the fused decode step on the decoder's state layout (the
hybrid step's: ops/hybrid/op.py).
favor::attention's CUDA kernels (kernels.py: triton_forward, triton_backward) call the
forward and backward kernels under the op's autograd formula.

Precision of the dots: torch's own switch for fp32 matmuls decides, as for torch.matmul:
torch.backends.cuda.matmul.allow_tf32 False (torch's default) -> exact fp32 ('ieee'), True
-> 'tf32'. Under the interpreter (CPU tensors) dots are exact fp32 either way.
"""
import torch


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


def _f32(t):
    return None if t is None else t.to(torch.float32).contiguous()


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
