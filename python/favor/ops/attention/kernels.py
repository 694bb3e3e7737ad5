"""favor::attention's kernels for devices other than the CPU, on the op's own arguments
(op.py registers them): plain torch operations (generic.py), the default for every device,
and the fused Triton kernels (triton/), CUDA's. Each forward returns the op's four outputs
(y and the empty saved-state placeholders: these kernels recompute in the backward); each
backward the backward op's seven (dq, dk, dv, dw, dbias, dlambda, ddecay), the parameter
gradients empty unless asked for (dw has the shape of weights when given, else of w).

Both compute on the CanonicalMap (canonical.py) after C++'s checks of the map; the gradients
of the caller's map tensors come from the canonical ones by autograd through canonical_map.
"""
import torch

from . import paths
from .layout import backward_fake
from .._dispatch import triton_ready
from .triton_function import precision, supported


def _placeholders(q):
    """The op's saved-state outputs of a kernel that saves nothing (the backward recomputes)."""
    return (q.new_zeros(0, dtype=torch.float32), q.new_zeros(0, dtype=torch.float64),
            q.new_zeros(2, dtype=torch.int64), q.new_zeros(0, dtype=torch.float32))


def torch_forward(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis,
                  kernel, causal, scale, save_context, precision_name, window=0, sinks=0):
    """The default kernel: favor::attention by plain torch operations on any device."""
    y = paths.torch_attention(q.float(), k.float(), v.float(), w, weights, bias, lam, decay,
                              key_padding_mask, fit_a, fit_basis, kernel, causal, scale,
                              window=window, sinks=sinks)
    return (y, *_placeholders(q))


def _parameters(w, weights, bias, lam, decay, parameter_grads):
    """[(index in the op's seven outputs, tensor)] whose gradient the backward returns: dw
    belongs to weights when given, else to w."""
    if not parameter_grads:
        return []
    first = weights if weights is not None else w
    return [(i, t) for i, t in ((3, first), (4, bias), (5, lam), (6, decay)) if t is not None]


def _outputs(q, k, v, w, weights, bias, lam, decay, parameter_grads, grads):
    """The seven outputs from {index: gradient} (zeros where a parameter received none)."""
    out = list(backward_fake(q, k, v, w, weights, bias, lam, decay, parameter_grads))
    for i, t in enumerate(out):
        g = grads.get(i)
        out[i] = torch.zeros_like(t) if g is None else g.to(t.dtype).reshape(t.shape)
    return tuple(out)


def torch_backward(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a,
                   fit_basis, y, states, maxima, fingerprint, kernel, causal, scale,
                   parameter_grads, window=0, sinks=0, rows=None):
    """The default backward: autograd through the torch forward, recomputed."""
    leaves = {i: t.detach().float().requires_grad_(True) for i, t in enumerate((q, k, v))}
    params = {i: t.detach().requires_grad_(True)
              for i, t in _parameters(w, weights, bias, lam, decay, parameter_grads)}
    pick = lambda i, t: params.get(i, t)  # noqa: E731
    first_is_weights = weights is not None
    with torch.enable_grad():
        out = paths.torch_attention(
            leaves[0], leaves[1], leaves[2], w if first_is_weights else pick(3, w),
            pick(3, weights) if first_is_weights else weights, pick(4, bias), pick(5, lam),
            pick(6, decay), key_padding_mask, fit_a, fit_basis, kernel, causal, scale,
            window=window, sinks=sinks)
        wanted = {**leaves, **params}
        got = torch.autograd.grad(out, list(wanted.values()), dy.to(out.dtype),
                                  allow_unused=True)
    return _outputs(q, k, v, w, weights, bias, lam, decay, parameter_grads,
                    dict(zip(wanted, got)))


def _kernels():
    from . import triton as kernels  # imports triton: only when a Triton kernel runs
    return kernels


def _fused(q, k, v, w, weights, bias, lam, decay, mask, fit_a, fit_basis, kernel, causal,
           scale):
    """(q, k, v as [BH, N, D], keep [B, Nk] or None, heads, the map tensors as the fused
    kernels take them) after C++'s checks. The map is built with autograd on (its inputs may
    require grad in the backward)."""
    paths.check_inputs(q, k, v, causal, mask)
    fit_a, fit_basis = paths.call_fit(q, k, mask, fit_a, fit_basis, kernel, causal, scale)
    qf, kf, vf, keep, cm = paths.prepare(q, k, v, w, weights, bias, lam, decay, mask, fit_a,
                                         fit_basis, kernel, causal, scale)
    heads = q.shape[1] if q.dim() == 4 else 1
    keep_b = None if keep is None else keep[::heads].contiguous()
    f32 = lambda t: None if t is None else t.to(torch.float32).contiguous()  # noqa: E731
    return (qf.contiguous(), kf.contiguous(), vf.contiguous(), keep_b, heads, cm,
            (f32(cm.W), f32(cm.bias), f32(cm.key_logw), f32(cm.rate)))


def triton_forward(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis,
                   kernel, causal, scale, save_context, precision_name, window=0, sinks=0):
    """CUDA's kernel: the fused forward (without triton, or for head dims the kernels do not
    take: the default). Hybrid attention: the exact part's fused kernel (ops/hybrid/triton/band.py:
    the window inside the tile), the estimated parts and the merge in torch."""
    if (window or sinks) and triton_ready():
        from ..hybrid.triton import band
        y = paths.torch_attention(q.float(), k.float(), v.float(), w, weights, bias, lam, decay,
                                  key_padding_mask, fit_a, fit_basis, kernel, causal, scale,
                                  window=window, sinks=sinks, band=band)
        return (y, *_placeholders(q))
    if window or sinks or not (triton_ready() and supported(q.shape[-1], v.shape[-1])):
        return torch_forward(q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a,
                             fit_basis, kernel, causal, scale, save_context, precision_name,
                             window, sinks)
    qf, kf, vf, keep, heads, cm, (W, b, lw, rate) = _fused(
        q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a, fit_basis, kernel,
        causal, scale)
    y = _kernels().forward(qf, kf, vf, W, b, lw, rate, float(cm.norm_coef), cm.kind, causal,
                           keep, heads, precision=precision())
    return (y.float().reshape(*q.shape[:-1], v.shape[-1]), *_placeholders(q))


def triton_backward(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask, fit_a,
                    fit_basis, y, states, maxima, fingerprint, kernel, causal, scale,
                    parameter_grads, window=0, sinks=0, rows=None):
    """CUDA's backward: the fused backward kernel (which recomputes the states), the map's
    gradients carried back to the caller's tensors by autograd through canonical_map."""
    if window or sinks or not (triton_ready() and supported(q.shape[-1], v.shape[-1])):
        return torch_backward(dy, q, k, v, w, weights, bias, lam, decay, key_padding_mask,
                              fit_a, fit_basis, y, states, maxima, fingerprint, kernel, causal,
                              scale, parameter_grads, window, sinks)
    params = {i: t.detach().requires_grad_(True)
              for i, t in _parameters(w, weights, bias, lam, decay, parameter_grads)}
    first_is_weights = weights is not None
    args = [w if first_is_weights else params.get(3, w),
            params.get(3, weights) if first_is_weights else weights, params.get(4, bias),
            params.get(5, lam), params.get(6, decay)]
    with torch.enable_grad():
        qf, kf, vf, keep, heads, cm, canon = _fused(q, k, v, *args, key_padding_mask, fit_a,
                                                    fit_basis, kernel, causal, scale)
    yf = y.reshape(qf.shape[0], qf.shape[1], -1).contiguous()
    dyf = dy.float().reshape(yf.shape).contiguous()
    dq, dk, dv, dW, db, dlw, dr = _kernels().backward(
        dyf, qf, kf, vf, yf, *(t.detach() if t is not None else None for t in canon),
        float(cm.norm_coef), cm.kind, causal, keep, heads, precision=precision(),
        need_params=bool(params))
    grads = {0: dq.reshape(q.shape), 1: dk.reshape(k.shape), 2: dv.reshape(v.shape)}
    if params:
        pairs = [(t, g) for t, g in zip(canon, (dW, db, dlw, dr))
                 if t is not None and g is not None and t.requires_grad]
        got = torch.autograd.grad([t for t, _ in pairs], list(params.values()),
                                  [g.to(t.dtype) for t, g in pairs], allow_unused=True)
        grads.update(zip(params, got))
    return _outputs(q, k, v, w, weights, bias, lam, decay, parameter_grads, grads)



def _require_fused(q, v, hybrid=()):
    """backend='triton' forces the fused kernels: sizes they do not take are an error there
    (CUDA's registration falls back to the default kernel instead). Hybrid attention takes
    any size (its fused part, the band, does)."""
    from .triton_function import HEAD_DIMS, MAX_DV
    if any(hybrid):
        return
    if not supported(q.shape[-1], v.shape[-1]):
        from ... import _core
        raise _core.Error(f"backend: 'triton' takes head dims D in {HEAD_DIMS} and Dv <= "
                          f"{MAX_DV}; got D = {q.shape[-1]}, Dv = {v.shape[-1]} (use "
                          "backend='torch')")


def forced_triton_forward(q, k, v, *args):
    _require_fused(q, v, args[13:15])  # (forced() has checked that triton runs)
    return triton_forward(q, k, v, *args)


def forced_triton_backward(dy, q, k, v, *args):
    _require_fused(q, v, args[16:18])
    return triton_backward(dy, q, k, v, *args)
