"""Checks and launch parameters shared by the Triton wrappers (attend.py, gradients.py, decode.py).

The wrappers take the canonical map (favor's C++ kernels' parameters, prepared by the caller:
W with sqrt(scale) folded in, key_logw = log lambda^2, rate = -log gamma, norm_coef) and
raise ValueError naming the argument that breaks a rule. Parameter sets: head bh uses set
bh % sets, with sets 1, H or B*H.
"""
import os

import torch
import triton

KINDS = {0: "EXP", 1: "EXP_PM", 2: "TRIG"}
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
PRECISIONS = ("ieee", "tf32", "tf32x3")


def interpreting():
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1): one small config then."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def tuned(key):
    """On the device, triton.autotune over num_warps and num_stages keyed on the sizes that
    set a program's work (block sizes stay the wrapper's); under the interpreter the kernel
    as it is (the wrappers then pass launch_options())."""
    def wrap(fn):
        if interpreting():
            return fn
        configs = [triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in (2, 3)]
        return triton.autotune(configs=configs, key=key)(fn)
    return wrap


def launch_options(num_warps):
    """num_warps for an untuned launch (the interpreter); the autotuner chooses otherwise."""
    return {"num_warps": num_warps} if interpreting() else {}


def pow2(n, lo=16):
    """The power of two >= n and >= lo (tl.dot needs tile sides >= 16)."""
    return max(lo, triton.next_power_of_2(int(n)))


def check_rows(t, name, bh, n=None, d=None):
    """t [BH, N, D], contiguous, fp32/fp16/bf16."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(f"{name}: shape {list(t.shape)} must be [BH, N, D] (3 dims)")
    if t.dtype not in FLOATS:
        raise ValueError(f"{name}: dtype {t.dtype} must be float32, float16 or bfloat16")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")
    if bh is not None and t.shape[0] != bh:
        raise ValueError(f"{name}: BH = {t.shape[0]} differs from q's {bh}")
    if n is not None and t.shape[1] != n:
        raise ValueError(f"{name}: N = {t.shape[1]} must be {n}")
    if d is not None and t.shape[2] != d:
        raise ValueError(f"{name}: last dim {t.shape[2]} must be {d}")


def check_sets(sets, name, bh, heads):
    """sets must be 1, H or B*H."""
    if sets not in (1, heads, bh):
        raise ValueError(f"{name}: {sets} parameter sets; must be 1, H ({heads}) or B*H ({bh})")


def map_parameters(W, bias, key_logw, rate, norm_coef, kind, bh, heads, d, device, causal):
    """Checked map parameters: (W, bias, key_logw, rate) fp32 contiguous (a dummy pointer, W,
    for those that are None), their set counts, m, F and the flags HAS_BIAS, HAS_LOGW,
    HAS_RATE."""
    if kind not in KINDS:
        raise ValueError(f"kind: {kind} must be 0 (EXP), 1 (EXP_PM) or 2 (TRIG)")
    if not isinstance(heads, int) or heads < 1 or bh % heads:
        raise ValueError(f"heads: {heads} must be a positive divisor of BH = {bh}")
    if not isinstance(W, torch.Tensor) or W.dim() != 3 or W.shape[2] != d:
        raise ValueError(f"W: must be a [sets, m, {d}] tensor"
                         f"{'' if not isinstance(W, torch.Tensor) else f', got {list(W.shape)}'}")
    if W.dtype != torch.float32 or not W.is_contiguous() or W.device != device:
        raise ValueError("W: must be contiguous float32 on q's device")
    check_sets(W.shape[0], "W", bh, heads)
    m = W.shape[1]
    if m < 1:
        raise ValueError("W: m must be >= 1")
    out, sets = [], [W.shape[0]]
    for t, name, shape in ((bias, "bias", (m,)), (key_logw, "key_logw", (m,)), (rate, "rate", ())):
        if t is None:
            out.append(W)
            sets.append(1)
            continue
        if (not isinstance(t, torch.Tensor) or t.dim() != 1 + len(shape)
                or tuple(t.shape[1:]) != shape):
            raise ValueError(f"{name}: must be a [sets{', ' + str(m) if shape else ''}] tensor")
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device != device:
            raise ValueError(f"{name}: must be contiguous float32 on q's device")
        check_sets(t.shape[0], name, bh, heads)
        out.append(t)
        sets.append(t.shape[0])
    if rate is not None and not causal:
        raise ValueError("rate: decay is causal only")
    if not isinstance(norm_coef, (int, float)):
        raise ValueError(f"norm_coef: {norm_coef!r} must be a float")
    f = m if kind == 0 else 2 * m
    flags = dict(HAS_BIAS=bias is not None, HAS_LOGW=key_logw is not None,
                 HAS_RATE=rate is not None)
    return (W, *out), sets, m, f, flags


def keep_mask(keep, batch, n, device):
    """keep [B, N] bool / int8 (nonzero = the key takes part) as int8 contiguous, or None."""
    if keep is None:
        return None
    if not isinstance(keep, torch.Tensor) or tuple(keep.shape) != (batch, n):
        raise ValueError(f"keep: must be a [B, N] = [{batch}, {n}] tensor")
    if keep.dtype not in (torch.bool, torch.int8, torch.uint8) or keep.device != device:
        raise ValueError("keep: must be bool or int8 on q's device")
    return keep.to(torch.int8).contiguous()


def check_precision(precision):
    if precision not in PRECISIONS:
        raise ValueError(f"precision: {precision!r} must be 'ieee', 'tf32' or 'tf32x3'")
