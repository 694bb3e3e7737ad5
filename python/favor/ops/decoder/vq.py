"""favor::vq_decode_step: Transformer-VQ's streaming decoder as one torch op on one state
(VQDecodeState), advanced in place, as favor::decode_step is FAVOR's: append keys and
values, query, one fused step, or a prompt's prefill.

The state is the C++ VQDecoderState's layout as tensors: sums [B, H, c, Dv] float32 (per
code, the sum of its keys' values; soft VQ: weighted by p(s|k)), counts [B, H, c] float32
(per code, its key count), position [1] int64. Kernels: CPU the C++ VQDecoder on a view of
the state (no copy); every other device plain torch operations (this file's default), which
CUDA takes too (VQ has no fused Triton kernel).
"""
import math
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ... import _core
from .. import _dispatch
from .. import _tensors as T
from ..attention.op import eager_mode
from .op import _step_checks, borrowed_step, built_decoder, check_step_inputs


class VQDecodeState(NamedTuple):
    """Transformer-VQ's decoding state (see the module docstring); new fields go at the end."""
    sums: Tensor
    counts: Tensor
    position: Tensor


def empty_vq_state(batch, heads, dv, codes, device=None):
    """The VQDecodeState with nothing appended."""
    return VQDecodeState(torch.zeros(batch, heads, codes, dv, device=device),
                         torch.zeros(batch, heads, codes, device=device),
                         torch.zeros(1, dtype=torch.int64, device=device))


def _codebook4(codebook):
    """[c, D] or [H or 1, c, D] as [1, H or 1, c, D]."""
    return (codebook[None] if codebook.dim() == 2 else codebook)[None]


def _assign(k, codebook, tau):
    """p(s|k) [B, H, T, c]: one-hot of the nearest code (hard VQ; ties to the lowest index)
    or softmax_s(-|k - C_s|^2 / tau) (soft VQ)."""
    cb = _codebook4(codebook.float())
    d2 = (k.double().unsqueeze(-2) - cb.double().unsqueeze(2)).pow(2).sum(-1)  # [B, H, T, c]
    if tau == 0:
        return torch.nn.functional.one_hot(d2.argmin(-1), cb.shape[-2]).float()
    return torch.softmax(-d2 / tau, -1).float()


def generic_append(state, k, v, codebook, tau, key_mask=None):
    sums, counts, position = state
    p = _assign(k, codebook, tau)
    if key_mask is not None:
        p = p * key_mask.to(k.device).ne(0)[:, None, :, None].float()
    return (sums + torch.einsum("bhtc,bhtd->bhcd", p, v.float()), counts + p.sum(2),
            position + k.shape[2])


def generic_query(state, q, codebook, scale):
    """y = sum_s e_s sums_s / sum_s e_s n_s, e_s = exp(scale q.C_s - max over live codes);
    a head with no key gives zeros."""
    sums, counts, _ = state
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    logits = s * (q.float() @ _codebook4(codebook.float()).transpose(-1, -2))   # [B, H, T, c]
    live = (counts > 0).unsqueeze(2)
    top = logits.masked_fill(~live, float("-inf")).amax(-1, keepdim=True)
    top = top.masked_fill(torch.isinf(top), 0.0)
    e = torch.exp((logits - top).masked_fill(~live, float("-inf")))
    num, den = e @ sums, (e * counts.unsqueeze(2)).sum(-1, keepdim=True)
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def _generic(sums, counts, position, q, k, v, key_mask, codebook, scale, tau, step_kind):
    check_step_inputs(q, k, v, key_mask, step_kind)
    state = (sums, counts, position)
    if step_kind == "append":
        return q.new_empty((*q.shape[:-1], v.shape[-1])), generic_append(state, k, v, codebook,
                                                                        tau, key_mask)
    if step_kind == "query":
        return generic_query(state, q, codebook, scale), state
    if step_kind != "prefill":
        new = generic_append(state, k, v, codebook, tau, key_mask)
        return generic_query(new, q, codebook, scale), new
    rows = []
    for i in range(q.shape[2]):  # causal: token i reads the state after its own append
        sl = slice(i, i + 1)
        state = generic_append(state, k[:, :, sl], v[:, :, sl], codebook, tau,
                               None if key_mask is None else key_mask[:, sl])
        rows.append(generic_query(state, q[:, :, sl], codebook, scale))
    return torch.cat(rows, 2), state


def torch_vq_decode(sums, counts, position, q, k, v, key_mask, codebook, scale, tau, step_kind):
    """The default kernel: plain torch operations, the result written into the state."""
    y, new = _generic(sums, counts, position, q, k, v, key_mask, codebook, scale, tau,
                      step_kind)
    for t, n in zip((sums, counts, position), new):
        t.copy_(n)
    return y


@torch.library.custom_op("favor::vq_decode_step", mutates_args=("sums", "counts", "position"),
                         device_types=None)
def vq_decode_step_op(sums: Tensor, counts: Tensor, position: Tensor, q: Tensor, k: Tensor,
                      v: Tensor, key_mask: Optional[Tensor], codebook: Tensor,
                      scale: Optional[float], tau: float, step_kind: str) -> Tensor:
    """y [B, H, T, Dv] float32, the state (a VQDecodeState) advanced in place; step_kind as
    favor::decode_step's (step, append, query, append_query, prefill). codebook [c, D] or
    [H or 1, c, D]; tau 0: hard VQ, > 0: soft."""
    return torch_vq_decode(sums, counts, position, q, k, v, key_mask, codebook, scale, tau,
                           step_kind)


def _vq_decoder(batch, heads, dv, codebook, scale, tau):
    return _core.VQDecoder(batch, heads, dv, T.view(codebook.detach().float().contiguous()),
                           scale=scale, tau=float(tau))


def cpu_vq_step(dec, state, q, k, v, key_mask, step_kind):
    """The CPU kernel with the C++ VQDecoder of the codebook given (an owner keeps one)."""
    return borrowed_step(dec, state, q, k, v, key_mask, step_kind)


@vq_decode_step_op.register_kernel("cpu")
def cpu_vq_decode(sums, counts, position, q, k, v, key_mask, codebook, scale, tau, step_kind):
    b, h, dv = v.shape[0], v.shape[1], v.shape[-1]
    dec = built_decoder(lambda: _vq_decoder(b, h, dv, codebook, scale, tau),
                        ("vq", b, h, dv, scale, float(tau)), (codebook,))
    return cpu_vq_step(dec, (sums, counts, position), q, k, v, key_mask, step_kind)


@vq_decode_step_op.register_fake
def _(sums, counts, position, q, k, v, key_mask, codebook, scale, tau, step_kind):
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


_dispatch.register("vq_decode_step", {"cpu": cpu_vq_decode, "torch": torch_vq_decode})


def vq_advance(state, q, k, v, codebook, *, mode="step", scale=None, tau=0.0, key_mask=None,
               backend=None, decoder=None):
    """favor::vq_decode_step on a VQDecodeState advanced in place; returns y [B, H, T, Dv]
    float32. mode as favor.ops.decoder.advance's; decoder: the favor._core.VQDecoder of this
    codebook, kept by an owner (eager CPU calls then skip the op's dispatch: the same
    kernel)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (codebook, "codebook")):
        T.check_tensor(t, name)
    key_mask = _step_checks(q, k, v, key_mask, mode)
    forced = _dispatch.forced("vq_decode_step", backend, q)
    if not isinstance(state, (tuple, list)) or len(state) != 3 or not all(
            isinstance(t, torch.Tensor) for t in state):
        raise _core.Error("state: must be a VQDecodeState (sums, counts, position tensors), "
                          "as empty_vq_state() makes it")
    state = tuple(state)
    if decoder is not None and eager_mode() and _dispatch.cpu_kernel_runs(backend, q, k, v,
                                                                           *state):
        return cpu_vq_step(decoder, state, q, k, v, key_mask, mode)  # no op dispatch
    if not torch.compiler.is_compiling():
        codes = codebook.shape[-2]
        b, h, dv = q.shape[0], q.shape[1], v.shape[-1]
        # the codebook against the heads and D: C++'s rule on a host copy
        _vq_decoder(1, h, 1, codebook.detach().cpu(), scale, tau)
        if codebook.shape[-1] != q.shape[-1]:
            raise _core.Error(f"q: shape {list(q.shape)} has D = {q.shape[-1]}; the codebook "
                              f"has D = {codebook.shape[-1]}")
        for t, shape, dtype, name in zip(state, ((b, h, codes, dv), (b, h, codes), (1,)),
                                         (torch.float32, torch.float32, torch.int64),
                                         ("sums", "counts", "position")):
            if tuple(t.shape) != shape:
                raise _core.Error(f"state.{name}: shape {list(t.shape)} must be {list(shape)}")
            if t.dtype != dtype:
                raise _core.Error(f"state.{name}: dtype {t.dtype} must be {dtype}")
            if t.device != q.device:
                raise _core.Error(f"state.{name}: on device '{t.device}', q on '{q.device}'; "
                                  "move the state with .to(device)")
    dev = q.device
    args = (*state, q.float(), k.float(), v.float(),
            None if key_mask is None else key_mask.to(dev), codebook.detach().float().to(dev),
            scale, float(tau), mode)
    with torch.no_grad():
        return (vq_decode_step_op if forced is None else forced)(*args)
