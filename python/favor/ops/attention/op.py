"""favor::attention and favor::attention_backward: FAVOR attention (every kernel, and learned
feature maps: per-head weights, bias, feature weights lambda, decay) as torch custom ops.

Everything that is not a tensor is a plain value (str, bool, float), so torch.compile and
torch.export trace the ops as single nodes; the fake implementations give the output shapes
from the input shapes. The forward returns, besides y, the saved key state of a
bidirectional call (or a causal one's chunk states, save_causal_states) as four tensors
(states, maxima, [valid, fingerprint], rows) that the backward takes back: no recomputation,
no copy (the tensors are views of C++'s arrays, read back through an AttentionContextView),
and no Python object travels between the two.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ... import _core
from .. import _tensors as T
from .layout import backward_fake, decay_list, feature_map, uses_map  # noqa: F401

# The fingerprint of a context is a uint64; tensors hold it as int64 (two's complement).
_U64 = 1 << 64


def _signed(u):
    return u - _U64 if u >= _U64 // 2 else u


def _unsigned(s):
    return s + _U64 if s < 0 else s


def _state_size(q, v, w, kernel, causal=False, window=0, sinks=0):
    """(entries of the saved states, of the maxima, of the rows among the states) for q [..,
    Nq, D], v [.., Nk, Dv] and a projection w [m, D]: [B*H][F][Dv + 1] and [B*H], F =
    _core.feature_count(kernel, m) (2m or m: linear in m, so the rule is asked for m = 1 and
    works on symbolic sizes). Causal (save_causal_states): [B*H][S][F][Dv + 1] chunk states
    followed by the rows [B*H][Nq][Dv + 1], and [B*H][S], S = _core.causal_context_states(Nq)
    (ceil(Nq / C) + 1, C = _core.causal_context_chunk, written out for symbolic sizes).
    Hybrid (window or sinks): each estimated part's view saves as a causal call, the
    prefix's R = N - window rows, a bidirectional call's suffix's R' = N - max(window, 1)
    after them, then the merge's rows, C++'s hybrid_context_layout (_core.
    hybrid_context_sizes; the tests hold the two equal): states [B*H][S_R + S_R'][F][Dv + 1],
    rows [B*H][R + R'][Dv + 1] and y [B*H][N][Dv]; maxima [B*H][S_R + S_R'], lse [B*H][N]
    and the parts' log scales [B*H][R + R']; nothing when window >= N."""
    bh = q.shape[0] * q.shape[1] if q.dim() == 4 else 1
    f = _core.feature_count(kernel, 1) * w.shape[0]
    n, dv, chunk = q.shape[-2], v.shape[-1], _core.causal_context_chunk
    if window or sinks:
        if window >= n:
            return 0, 0, 0
        parts = [n - window] + ([n - max(window, 1)] if not causal and max(window, 1) < n
                                else [])
        slots = sum((r + chunk - 1) // chunk + 1 for r in parts)
        rows = bh * (sum(parts) * (dv + 1) + n * dv)
        return bh * slots * f * (dv + 1) + rows, bh * (slots + n + sum(parts)), rows
    if not causal:
        return bh * f * (dv + 1), bh, 0
    slots = (n + chunk - 1) // chunk + 1
    rows = bh * n * (dv + 1)
    return bh * slots * f * (dv + 1) + rows, bh * slots, rows


def eager(tensors):
    """True when a forward may call C++ directly instead of through the favor::attention op:
    eager mode (not compiling, exporting or tracing), no gradient to record, plain tensors
    (no fake or subclass tensors) and no torch function or dispatch mode that would want to
    see the op (profilers, FlopCounter). The same kernel gives the same bits; what it saves is
    the op's dispatch (autograd and dynamo wrappers, output placeholders): tens of us per call,
    which is most of a tiny call (docs/performance.md, "Per-call overhead")."""
    if not eager_mode():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not torch.Tensor or (grad and t.requires_grad)):
            return False
    return True


def eager_mode():
    """eager()'s rule on the mode alone: not compiling, exporting or tracing, and no torch
    function or dispatch mode active."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing()
                or torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack())


def plain_inputs(q, k, v, key_padding_mask):
    """True when q, k, v are what the eager fast path of favor.torch.attention takes without
    the general checks: plain dense float32 CPU tensors (no subclass, not nested), without a
    gradient to record, and a mask that is None or a plain CPU tensor. Anything else (which
    may still be valid) goes through the general path, which checks it and names the
    argument: this only decides which path runs, never what is an error."""
    grad = torch.is_grad_enabled()
    for t in (q, k, v):
        if (type(t) is not torch.Tensor or t.dtype is not torch.float32 or not t.is_cpu
                or t.layout is not torch.strided or t.is_nested or (grad and t.requires_grad)):
            return False
    m = key_padding_mask
    return m is None or (type(m) is torch.Tensor and m.is_cpu and m.layout is torch.strided
                         and not (grad and m.requires_grad))


def eager_attention(q, k, v, proj, key_padding_mask, fit_a, fit_basis, kernel, causal, scale,
                    precision, window=0, sinks=0):
    """y of favor::attention without the op (eager() said so), for a plain projection given
    as a favor.Projection (drawn ones are cached: no m x d copy per call)."""
    return T.tensor(_call(q, k, v, None, None, None, None, None, key_padding_mask, fit_a,
                          fit_basis, kernel, causal, scale, False, proj=proj,
                          precision=precision, window=window, sinks=sinks)[0])


def _call(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, kernel,
          causal, scale, save_context, dy=None, parameter_grads=False, context=None, proj=None,
          precision="f32", window=0, sinks=0):
    """The C++ call of the forward (dy None) or the backward, on numpy views of the tensors
    (proj: the favor.Projection of w, when the caller has it)."""
    hybrid = dict(window=window, sinks=sinks)
    T.follow_torch_threads()
    keep = T.keep_mask(key_padding_mask)
    qv, kv, vv = T.view(q), T.view(k), T.view(v)
    if not uses_map(weights, bias, lam, decay):
        if proj is None:
            proj = _core.Projection.from_matrix(T.array(w))
        fit = None if fit_a is None else _core.KernelFit(T.array(fit_a), T.array(fit_basis))
        if dy is None:
            return _core.attention(qv, kv, vv, proj, kernel=kernel, causal=causal, scale=scale,
                                   key_mask=keep, fit=fit, save_context=save_context,
                                   precision=precision, save_causal_states=save_context, **hybrid)
        return _core.attention_backward(qv, kv, vv, T.view(dy), proj, kernel=kernel,
                                        causal=causal, scale=scale, key_mask=keep, fit=fit,
                                        projection_grad=parameter_grads, context=context, **hybrid)
    fm = feature_map(w, weights, bias, lam, fit_a, fit_basis, kernel, scale)
    gammas = decay_list(decay)
    if dy is None:
        return _core.attention_map(qv, kv, vv, fm, causal=causal, key_mask=keep, decay=gammas,
                                   save_context=save_context, precision=precision,
                                   save_causal_states=save_context, **hybrid)
    return _core.attention_map_backward(qv, kv, vv, T.view(dy), fm, causal=causal,
                                        key_mask=keep, decay=gammas,
                                        parameter_grads=parameter_grads, context=context, **hybrid)


@torch.library.custom_op("favor::attention", mutates_args=(), device_types=None)
def attention_op(q: Tensor, k: Tensor, v: Tensor, w: Tensor, weights: Optional[Tensor],
                 bias: Optional[Tensor], lam: Optional[Tensor], decay: Optional[Tensor],
                 key_padding_mask: Optional[Tensor], fit_a: Optional[Tensor],
                 fit_basis: Optional[Tensor], kernel: str, causal: bool, scale: Optional[float],
                 save_context: bool, precision: str, window: int = 0, sinks: int = 0
                 ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(y [.., Nq, Dv] float32, states, maxima, fingerprint, rows): the saved key state
    (empty unless save_context; causal: the chunk states, and the rows apart, save_causal_states;
    only the CPU kernel saves one, as views of C++'s arrays, no copy; a hybrid call its
    parts' chunk states and rows, _state_size). precision: 'f32' or 'bf16'
    (AttentionOptions::precision; the backward is float32). window, sinks: hybrid attention
    (AttentionOptions::window, ::sinks).
    Kernels: CPU the C++ library (cpu_forward), CUDA the fused Triton kernels, every other
    device plain torch operations (this default; kernels.py)."""
    from .kernels import torch_forward
    return torch_forward(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a,
                         fit_basis, kernel, causal, scale, save_context, precision, window,
                         sinks)


@attention_op.register_kernel("cpu")
def cpu_forward(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis,
                kernel, causal, scale, save_context, precision, window=0, sinks=0):
    """favor::attention's CPU kernel: the C++ library."""
    y, _, ctx = _call(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis,
                      kernel, causal, scale, save_context, precision=precision, window=window,
                      sinks=sinks)
    n_states, n_maxima, n_rows = (_state_size(q, v, w, kernel, causal, window, sinks)
                                  if save_context else (0, 0, 0))
    if ctx is None:  # nothing saved (or no state to save): the backward recomputes
        return (T.tensor(y), torch.zeros(n_states - n_rows),
                torch.zeros(n_maxima, dtype=torch.float64), torch.zeros(2, dtype=torch.int64),
                torch.zeros(n_rows))
    # views of the context's arrays (no copy; they keep it alive until the backward)
    states, maxima, rows = ctx.states, ctx.maxima, ctx.rows
    if states.size + rows.size != n_states or maxima.size != n_maxima or rows.size != n_rows:
        raise RuntimeError(f"favor::attention: saved state of {states.size} + {rows.size} + "
                           f"{maxima.size} entries, expected {n_states} (rows {n_rows}) + "
                           f"{n_maxima}")
    return (T.tensor(y), T.tensor(states), T.tensor(maxima),
            torch.tensor([1, _signed(ctx.fingerprint)], dtype=torch.int64), T.tensor(rows))


@attention_op.register_fake
def _(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, kernel, causal,
      scale, save_context, precision, window=0, sinks=0):
    n_states, n_maxima, n_rows = (_state_size(q, v, w, kernel, causal, window, sinks)
                                  if save_context else (0, 0, 0))
    y = q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)
    return (y, q.new_empty(n_states - n_rows, dtype=torch.float32),
            q.new_empty(n_maxima, dtype=torch.float64), q.new_empty(2, dtype=torch.int64),
            q.new_empty(n_rows, dtype=torch.float32))


@torch.library.custom_op("favor::attention_backward", mutates_args=(), device_types=None)
def attention_backward_op(dy: Tensor, q: Tensor, k: Tensor, v: Tensor, w: Tensor,
                          weights: Optional[Tensor], bias: Optional[Tensor], lam: Optional[Tensor],
                          decay: Optional[Tensor], key_padding_mask: Optional[Tensor],
                          fit_a: Optional[Tensor], fit_basis: Optional[Tensor], y: Tensor,
                          states: Tensor, maxima: Tensor, fingerprint: Tensor, kernel: str,
                          causal: bool, scale: Optional[float], parameter_grads: bool,
                          window: int = 0, sinks: int = 0, rows: Optional[Tensor] = None
                          ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dw, dbias, dlambda, ddecay); the parameter gradients are empty unless
    parameter_grads (then dw has the shape of weights when given, else of w; dbias, dlambda
    and ddecay those of bias, lam and decay, or empty when those are None). y is the
    forward's output (the fused backward reads it); rows a causal context's rows (the
    forward's fifth output). Kernels as favor::attention's."""
    from .kernels import torch_backward
    return torch_backward(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a,
                          fit_basis, y, states, maxima, fingerprint, kernel, causal, scale,
                          parameter_grads, window, sinks)


@attention_backward_op.register_kernel("cpu")
def cpu_backward(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis,
                 y, states, maxima, fingerprint, kernel, causal, scale, parameter_grads,
                 window=0, sinks=0, rows=None):
    """favor::attention_backward's CPU kernel: the C++ backward, from the saved state when the
    forward kept one (read in place: an AttentionContextView of the tensors)."""
    context = None
    if states.numel() and int(fingerprint[0]) == 1:
        context = _core.AttentionContextView.from_arrays(
            T.array(states), T.array(maxima), _unsigned(int(fingerprint[1])),
            T.array(rows) if causal or window or sinks else None)
    out = _call(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis,
                kernel, causal, scale, False, dy=dy, parameter_grads=parameter_grads,
                context=context, window=window, sinks=sinks)
    return backward_outputs(out, weights, bias, lam, decay)


def backward_outputs(out, weights, bias, lam, decay):
    """The C++ backward's (dq, dk, dv, dw[, dbias, dlambda, ddecay]) as the backward op's
    seven tensors (empty where not computed)."""
    grads = [T.tensor(g) for g in out[:3]]
    if not uses_map(weights, bias, lam, decay):
        dw = out[3]
        return (*grads, T.empty() if dw is None else T.tensor(dw), T.empty(), T.empty(),
                T.empty(torch.float64))
    dw, db, dl, dd = out[3:]
    as_t = lambda g, dtype=torch.float32: T.empty(dtype) if g is None else T.tensor(g)
    if dd is not None and decay is not None:
        dd = dd.reshape(decay.shape)
    return (*grads, as_t(dw), as_t(db), as_t(dl), as_t(dd, torch.float64))


def input_grads(need, dq, dk, dv, dw, db, dl, dd, weights):
    """The gradients of (q, k, v, w, weights, bias, lam, decay) from a backward op's outputs
    (None where not needed: dw belongs to weights when given, else to w)."""
    pick = lambda i, g: g if need[i] else None
    dw_of_w, dw_of_weights = (None, dw) if weights is not None else (dw, None)
    return (pick(0, dq), pick(1, dk), pick(2, dv), pick(3, dw_of_w), pick(4, dw_of_weights),
            pick(5, db), pick(6, dl), pick(7, dd))


@attention_backward_op.register_fake
def _(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, y, states,
      maxima, fingerprint, kernel, causal, scale, parameter_grads, window=0, sinks=0, rows=None):
    return backward_fake(q, k, v, w, weights, bias, lam, decay, parameter_grads)


class Formula:
    """favor::attention's autograd formula (one for every kernel): the forward saves its
    inputs, y and the saved key state; the backward calls the backward op (or, for a forced
    kernel, ops/_dispatch.py, that kernel's backward)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        (q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, kernel,
         causal, scale, _, _, window, sinks) = inputs
        y, states, maxima, fingerprint, rows = output
        ctx.save_for_backward(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a,
                              fit_basis, y, states, maxima, fingerprint, rows)
        ctx.options = (kernel, causal, scale)
        ctx.hybrid = (window, sinks)

    @staticmethod
    def backward(ctx, dy, *_, backward_op=None, need=None):
        (q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, y, states,
         maxima, fingerprint, rows) = ctx.saved_tensors
        need = ctx.needs_input_grad if need is None else need
        run = attention_backward_op if backward_op is None else backward_op
        dq, dk, dv, dw, db, dl, dd = run(
            dy.to(torch.float32), q, k, v, w, weights, bias, lam, decay, key_padding_mask,
            fit_a, fit_basis, y.detach(), states, maxima, fingerprint, *ctx.options,
            any(need[3:8]), *ctx.hybrid, rows)
        return (*input_grads(need, dq, dk, dv, dw, db, dl, dd, weights), *(None,) * 10)


attention_op.register_autograd(Formula.backward, setup_context=Formula.setup_context)


def _register_device_kernels():
    """CUDA's kernels (the fused Triton ones) and the table backend= forces
    (ops/_dispatch.py)."""
    from .. import _dispatch
    from . import kernels
    attention_op.register_kernel("cuda")(kernels.triton_forward)
    attention_backward_op.register_kernel("cuda")(kernels.triton_backward)
    _dispatch.register("attention", {"cpu": (cpu_forward, cpu_backward),
                                     "torch": (kernels.torch_forward, kernels.torch_backward),
                                     "triton": (kernels.forced_triton_forward,
                                                kernels.forced_triton_backward)})


_register_device_kernels()
