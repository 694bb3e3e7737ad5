"""favor.distributed.attention: sequence-parallel FAVOR attention, the layer over the torch
ops favor::sequence_parallel_attention(_backward) (favor/ops/sequence_parallel).

Every rank holds a contiguous slice of the sequence (rank order = sequence order); the forward
pass and the backward pass each exchange per-head states only. The map's tensors are built by
the code that builds favor.torch.attention's (ops/attention: _map_tensors, fit_tensors), so
projections, kernels, fits, learned weights / bias / feature weights and a learned decay all
take the same route.
"""
import torch

from .. import _args, _core
from .._args import batch_heads
from ..ops import _tensors as T
from ..ops.attention import _decay_tensor, _map_tensors, fit_tensors
from ..ops.sequence_parallel import exchange_handle, sequence_parallel_attention_op
from ._agreement import agreed, check_exchange, flag, refuse
from .torch_exchange import TorchExchange


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


@T.names_key_padding_mask
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
        q32, k32, v32 = T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v")
        mask = T.check_mask(key_padding_mask)
        d, inputs = q.shape[-1], batch_heads(q)
        w, wt, b, lam, kern, sc, ft = _map_tensors(
            inputs, d, projection, features, norms, seed, kernel, scale, fit, feature_map,
            weights, bias, feature_weights)
        fit_a, fit_basis = fit_tensors(ft, kern, d, inputs)
        return (q32, k32, v32, w, wt, b, lam, _decay_tensor(decay), mask, fit_a, fit_basis,
                kern, flag(causal, "causal"), _args.optional_number(sc, "scale"))

    y = sequence_parallel_attention_op(*agreed(ex, prepare), exchange_handle(ex))
    return y if q.dtype == torch.float32 else y.to(q.dtype)
