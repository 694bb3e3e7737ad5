"""The numpy API of sequence-parallel attention: favor.attention / attention_backward and
favor.vq_attention / vq_attention_backward on this rank's slice, with an exchange (no torch
needed with an MPIExchange). What a rank does before the C++ call runs inside
_agreement.agreed: its errors reach the other ranks, who are in the call."""
from .. import _args, _core
from .._args import batch_heads, block_length, decay_values, head_dim
from ..api import FeatureMapGrads, Grads, _core_map
from ..vq import VQGrads, _values
from ._agreement import agreed, check_exchange, flag


def _map(q, kernel, features, projection, norms, seed, scale, fit, feature_map,
         feature_weights, decay):
    """(the favor._core.FeatureMap of the call, its decay list)."""
    draw = dict(kernel=kernel, features=features, projection=projection, norms=norms,
                seed=seed, scale=scale, fit=fit)
    fm = _core_map(head_dim(q, "q"), feature_map, feature_weights, decay, draw, force=True,
                   inputs=batch_heads(q))
    return fm, decay_values(decay)


def attention_numpy(q, k, v, *, exchange, causal=False, kernel="positive", features=None,
                    projection="orthogonal", norms="chi", seed=0, scale=None, key_mask=None,
                    fit=None, feature_map=None, feature_weights=None, decay=None,
                    full_output=False):
    """This rank's slice of sequence-parallel FAVOR attention: favor.attention's arguments
    (numpy arrays q [B, H, Nq_r, D], k [B, H, Nk_r, D], v [B, H, Nk_r, Dv], key_mask
    [B, Nk_r] nonzero = the key takes part) for this rank's contiguous slice, and the
    exchange over the ranks. Returns y [B, H, Nq_r, Dv]; full_output=True returns (y,
    favor._core.SequenceParallelStats)."""
    check_exchange(exchange)
    fm, gammas, full = agreed(exchange, lambda: (
        *_map(q, kernel, features, projection, norms, seed, scale, fit, feature_map,
              feature_weights, decay), flag(full_output, "full_output")))
    y, stats = _core.sequence_parallel_attention_map(q, k, v, fm, exchange, causal=causal,
                                                     key_mask=key_mask, decay=gammas)
    return (y, stats) if full else y


def attention_backward_numpy(q, k, v, dy, *, exchange, causal=False, kernel="positive",
                             features=None, projection="orthogonal", norms="chi", seed=0,
                             scale=None, key_mask=None, fit=None, feature_map=None,
                             feature_weights=None, decay=None, projection_grad=False,
                             parameter_grads=False, full_output=False):
    """The gradients of attention_numpy for dy [B, H, Nq_r, Dv] (this rank's output slice):
    Grads(dq, dk, dv, dw) of this rank's slice (dw [m, D] with projection_grad, else None),
    or with parameter_grads FeatureMapGrads(dq, dk, dv, dw, dbias, dlambda, ddecay). dw,
    dbias, dlambda and ddecay are this rank's share: their sum over ranks is the gradient of
    the whole sequence. full_output=True returns (grads, SequenceParallelStats)."""
    check_exchange(exchange)
    fm, gammas, params, dw, full = agreed(exchange, lambda: (
        *_map(q, kernel, features, projection, norms, seed, scale, fit, feature_map,
              feature_weights, decay), flag(parameter_grads, "parameter_grads"),
        flag(projection_grad, "projection_grad"), flag(full_output, "full_output")))
    *g, stats = _core.sequence_parallel_attention_map_backward(
        q, k, v, dy, fm, exchange, causal=causal, key_mask=key_mask, decay=gammas,
        parameter_grads=params or dw)
    grads = FeatureMapGrads(*g) if params else Grads(*g[:3], g[3] if dw else None)
    return (grads, stats) if full else grads


def _vq_options(codebook, scale, tau, block, full_output):
    """(the codebook's values, scale, tau, the block length as the binding takes them, and
    full_output)."""
    return (_values(codebook), _args.optional_number(scale, "scale"), _args.number(tau, "tau"),
            block_length(block), flag(full_output, "full_output"))


def vq_attention_numpy(q, k, v, codebook, *, exchange, causal=False, scale=None, key_mask=None,
                       tau=0.0, block=None, full_output=False):
    """This rank's slice of sequence-parallel Transformer-VQ attention: favor.vq_attention's
    arguments (numpy arrays q [B, H, Nq_r, D], k [B, H, Nk_r, D], v [B, H, Nk_r, Dv],
    key_mask [B, Nk_r] nonzero = the key takes part; codebook [c, D], [H or 1, c, D] or a
    favor.Codebook, the same values on every rank) for this rank's contiguous slice, and the
    exchange over the ranks. Returns y [B, H, Nq_r, Dv]; full_output=True returns (y,
    favor._core.SequenceParallelStats). block (the causal block length) may differ between
    ranks: the result does not depend on it."""
    check_exchange(exchange)
    values, scale, tau, blk, full = agreed(
        exchange, lambda: _vq_options(codebook, scale, tau, block, full_output), vq=True)
    y, stats = _core.sequence_parallel_vq_attention(q, k, v, values, exchange, causal=causal,
                                                    scale=scale, key_mask=key_mask,
                                                    tau=tau, block=blk)
    return (y, stats) if full else y


def vq_attention_backward_numpy(q, k, v, dy, codebook, *, exchange, causal=False, scale=None,
                                key_mask=None, tau=0.0, block=None, codebook_grad=False,
                                full_output=False):
    """The gradients of vq_attention_numpy for dy [B, H, Nq_r, Dv] (this rank's output
    slice): VQGrads(dq, dk, dv, dcodebook), dq, dk, dv of this rank's slice (as
    favor.vq_attention_backward: dk straight-through for hard VQ) and with codebook_grad
    dcodebook (the codebook's shape) this rank's share: its sum over ranks is the gradient of
    the whole sequence. codebook_grad must be the same on every rank. full_output=True
    returns (grads, SequenceParallelStats)."""
    check_exchange(exchange)
    values, scale, tau, blk, full = agreed(
        exchange, lambda: _vq_options(codebook, scale, tau, block, full_output), vq=True)
    *g, stats = _core.sequence_parallel_vq_attention_backward(
        q, k, v, dy, values, exchange, causal=causal, scale=scale, key_mask=key_mask,
        tau=tau, block=blk, codebook_grad=codebook_grad)
    grads = VQGrads(*g)
    return (grads, stats) if full else grads
