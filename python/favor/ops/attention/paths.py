"""The device-generic paths of favor.torch.attention, beside the C++ one (op.py): 'torch'
(plain torch operations, generic.py) and 'triton' (the fused kernels, triton/; kernels.py). Both
take the op's tensors, check them by C++'s rules (canonical.check_map) and run on the
CanonicalMap, heads flattened to [B*H, N, D]."""
import torch

from ... import _core
from .. import _tensors as T
from . import generic
from .canonical import canonical_map, check_map


def flat(x):
    """[B, H, N, D] or [N, D] as [B*H, N, D] (a view where the strides allow)."""
    return x.reshape(-1, *x.shape[-2:]) if x.dim() == 4 else x.unsqueeze(0)


def check_shapes(q, k, v, causal, mask=None, window=0, sinks=0):
    """The shape rules of the C++ attention, bound from C++ (favor::check_attention_shapes:
    its messages, no values read; hybrid attention's window and sinks), for kernels that do
    not call it."""
    _core.check_attention_shapes(list(q.shape), list(k.shape), list(v.shape), bool(causal),
                                 None if mask is None else list(mask.shape), window=window,
                                 sinks=sinks)


def keep_batch(key_padding_mask, device):
    """torch's key_padding_mask [B, Nk] as favor's keep [B, Nk] bool on device (True = the
    key takes part), or None (a float mask's values checked: T.checked_keep)."""
    keep = T.checked_keep(key_padding_mask)
    return None if keep is None else keep.to(device)


def keep_rows(key_padding_mask, q):
    """keep_batch repeated over the heads of q: [B*H, Nk], or None."""
    keep = keep_batch(key_padding_mask, q.device)
    heads = q.shape[1] if q.dim() == 4 else 1
    return None if keep is None else keep.repeat_interleave(heads, 0)


def check_inputs(q, k, v, causal, mask=None, window=0, sinks=0):
    """C++'s rules for the inputs: shapes (and a key mask's, window, sinks), finite values."""
    check_shapes(q, k, v, causal, mask, window, sinks)
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        T.check_finite(t, name)


def device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale, causal):
    """The CanonicalMap on q's device, after C++'s checks of the map (check_map)."""
    heads = q.shape[1] if q.dim() == 4 else 1
    batch = q.shape[0] if q.dim() == 4 else 1
    check_map(w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale, batch, heads,
              causal)
    to = lambda t: None if t is None else t.to(q.device)  # noqa: E731
    return canonical_map(to(w), to(weights), to(bias), to(lam), to(decay), to(fit_a),
                         to(fit_basis), kernel, scale, q.shape[-1])


def call_fit(q, k, mask, fit_a, fit_basis, kernel, causal, scale):
    """The fit a FAVOR++ / FAVOR# call runs with, as (fit_a, fit_basis) tensors on q's
    device: the one given, or (bidirectional, no fit given) C++'s fit of the call's own q and
    k (favor::fit_kernel on the host, the rule the C++ kernel applies inside the call:
    AdaptedProjection, one fit per (batch, head), masked keys left out), a constant of the
    gradient as there. Other kernels and causal calls (refused without a fit by check_map):
    as given."""
    if fit_a is not None or causal or not _core.data_adapted(kernel):
        return fit_a, fit_basis
    keep = keep_batch(mask, "cpu")
    fit = _core.fit_kernel(kernel, T.view(q.detach().float().cpu()),
                           T.view(k.detach().float().cpu()), scale,
                           key_mask=None if keep is None else T.array(keep))
    return (torch.as_tensor(fit.a).to(q.device), torch.as_tensor(fit.basis).to(q.device))


def prepare(q, k, v, w, weights, bias, lam, decay, mask, fit_a, fit_basis, kernel, causal,
            scale, window=0, sinks=0):
    """(q, k, v as [BH, N, D], keep, CanonicalMap) after every check the C++ op makes."""
    check_inputs(q, k, v, causal, mask, window, sinks)
    cm = device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale, causal)
    return flat(q), flat(k), flat(v), keep_rows(mask, q), cm


def torch_attention(q, k, v, w, weights, bias, lam, decay, mask, fit_a, fit_basis, kernel,
                    causal, scale, chunk=64, window=0, sinks=0, band=None):
    """favor::attention's result (float32 [.., Nq, Dv]) by plain torch operations (hybrid
    attention with a window or sinks: ops/hybrid/chunk.py)."""
    check_inputs(q, k, v, causal, mask, window, sinks)
    fit_a, fit_basis = call_fit(q, k, mask, fit_a, fit_basis, kernel, causal, scale)
    qf, kf, vf, keep, cm = prepare(q, k, v, w, weights, bias, lam, decay, mask, fit_a,
                                   fit_basis, kernel, causal, scale, window, sinks)
    if window or sinks:
        from ..hybrid.chunk import hybrid_attention, pair_log_const
        y = hybrid_attention(qf, kf, vf, cm, keep, causal, window, sinks, chunk,
                             scale=q.shape[-1] ** -0.5 if scale is None else float(scale),
                             log_const=pair_log_const(kernel, cm.W.shape[1], fit_a),
                             band=band)
    else:
        y = generic.attention(qf, kf, vf, cm, keep, causal, chunk)
    return y.reshape(*q.shape[:-1], v.shape[-1])
