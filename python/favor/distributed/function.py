"""favor.distributed.attention: sequence-parallel FAVOR attention as a torch.autograd.Function.

Every rank holds a contiguous slice of the sequence (rank order = sequence order); the forward
pass and the backward pass each exchange per-head states only (favor._core's
sequence_parallel_attention(_backward) over an Exchange). The map goes through the FeatureMap
call of favor.torch.attention's learned-map path (_MapSpec), so projections, kernels, fits,
learned weights / bias / feature weights and a learned decay all take the same route.
"""
import numpy as np
import torch
from torch.autograd.function import once_differentiable

from .. import _core
from .._args import batch_heads, decay_values
from ..ops import _tensors as T
from ._map_spec import _map_inputs, _MapSpec
from ._agreement import agreed, check_exchange, flag, refuse
from .torch_exchange import TorchExchange


def _record(exchange, name, stats):
    """Keeps the last call's SequenceParallelStats on the exchange (forward_stats,
    backward_stats) when it takes attributes."""
    try:
        setattr(exchange, name, stats)
    except AttributeError:
        pass


class _DistributedFunction(torch.autograd.Function):
    """This rank's slice of q, k, v and the map's parameter tensors (w, b, lam, gamma: each
    None or a tensor, as favor.torch's _MapFunction; fm the favor._core.FeatureMap of their
    values) -> this rank's output slice. What each pass does before its C++ call runs inside
    agreed (the other ranks are in the call)."""

    @staticmethod
    def forward(ctx, q, k, v, w, b, lam, gamma, spec, fm, exchange):
        qn, kn, vn, decay = agreed(exchange, lambda: (T.view(q), T.view(k), T.view(v),
                                                      spec.decay_values(gamma)))
        y, stats = _core.sequence_parallel_attention_map(
            qn, kn, vn, fm, exchange, causal=spec.causal, key_mask=spec.keep, decay=decay)
        _record(exchange, "forward_stats", stats)
        ctx.save_for_backward(q, k, v)
        ctx.fm, ctx.decay, ctx.spec, ctx.exchange = fm, decay, spec, exchange
        ctx.params = [None if t is None else (t.shape, t.dtype) for t in (w, b, lam, gamma)]
        return T.tensor(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        def views():  # saved_tensors raises on this rank alone for a tensor modified in place
            return [T.view(t) for t in (*ctx.saved_tensors, dy.to(torch.float32))]

        need = ctx.needs_input_grad
        *grads, stats = _core.sequence_parallel_attention_map_backward(
            *agreed(ctx.exchange, views), ctx.fm, ctx.exchange, causal=ctx.spec.causal,
            key_mask=ctx.spec.keep, decay=ctx.decay, parameter_grads=any(need[3:7]))
        _record(ctx.exchange, "backward_stats", stats)
        out = [T.tensor(g) if need[i] else None for i, g in enumerate(grads[:3])]
        for i, (param, g) in enumerate(zip(ctx.params, grads[3:])):
            if need[3 + i]:
                shape, dtype = param
                out.append(torch.from_numpy(np.asarray(g)).to(dtype).reshape(shape))
            else:
                out.append(None)
        return (*out, None, None, None)


def resolve_exchange(exchange, group, vq=False):
    """The exchange of a call: `exchange` (a favor._core.Exchange: MPIExchange,
    TorchExchange or a subclass of your own) or TorchExchange(group). Giving both is refused
    with the other ranks (vq: the VQ call's message)."""
    if exchange is not None:
        check_exchange(exchange)
        if group is not None:
            refuse(exchange, _core.Error("group: give a process group or an exchange, not both"),
                   vq)
        return exchange
    return TorchExchange(group)


def attention(q, k, v, *, causal=False, kernel="positive", projection="orthogonal",
              features=None, norms="chi", seed=0, scale=None, key_padding_mask=None, fit=None,
              feature_map=None, weights=None, bias=None, feature_weights=None, decay=None,
              group=None, exchange=None):
    """Differentiable sequence-parallel FAVOR attention on CPU tensors: this rank's slice.

    q [B, H, Nq_r, D], k [B, H, Nk_r, D], v [B, H, Nk_r, Dv] (or [N_r, D]): rank r's
    contiguous slice of the sequence (rank order = sequence order; any length, also 0) ->
    y [B, H, Nq_r, Dv], rank r's slice of the output of favor.torch.attention on the whole
    sequence, in the dtype of q. Bidirectional: every query sees every rank's keys; causal:
    Nq_r = Nk_r and queries see the keys before them on every rank. key_padding_mask
    [B, Nk_r]: this rank's keys, torch's convention (True or -inf = ignore the key).

    The options are favor.torch.attention's (kernel, projection / features / norms / seed,
    scale, fit, feature_map, weights, bias, feature_weights, decay) and must be the same on
    every rank (the ranks compare a fingerprint of shapes, options and map and raise the
    same favor.Error otherwise, as for any error a rank meets before the C++ call: one that
    is not a ValueError is named in the message and is the failing rank's __cause__).
    FAVOR++ / FAVOR# without a fit (bidirectional) fit to the moments of the whole sequence,
    summed over ranks.

    group: the torch.distributed process group (None: the default; gloo) the slices are
    spread over; or exchange: a favor.distributed.Exchange (MPIExchange, TorchExchange).

    Backward (collective: every rank must run it, so every rank's loss must depend on y):
    dq, dk, dv of this rank's slice, and for the map's parameter tensors (a projection
    tensor, weights, bias, feature_weights, a decay tensor) this rank's share of their
    gradient: sum them over ranks (torch.distributed.all_reduce of each .grad after
    backward), as for every other parameter of a model whose sequence is split. The last
    call's favor._core.SequenceParallelStats (offset, total, payload_bytes, collectives)
    are kept on the exchange as forward_stats and backward_stats.
    """
    ex = resolve_exchange(exchange, group)

    def prepare():  # inside agreed: the other ranks are in the call and raise its error too
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            T.check_tensor(t, name)
        T.follow_torch_threads()
        q32, k32, v32 = T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v")
        keep = T.keep_mask(key_padding_mask)
        (proj, kern, sc, ft), w, b, lam = _map_inputs(
            batch_heads(q), q.shape[-1], projection, features, norms, seed, kernel, scale, fit,
            feature_map, weights, bias, feature_weights)
        gamma = None
        if isinstance(decay, torch.Tensor):
            T.check_tensor(decay, "decay")
            gamma = decay
        constant = None if gamma is not None else decay_values(decay)
        spec = _MapSpec(proj, kern, sc, ft, flag(causal, "causal"), keep, constant)
        return (q32, k32, v32, w, b, lam, gamma, spec, spec.core_map(w, b, lam))

    y = _DistributedFunction.apply(*agreed(ex, prepare), ex)
    return y if q.dtype == torch.float32 else y.to(q.dtype)
