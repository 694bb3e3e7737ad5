"""favor.distributed.vq_attention: sequence-parallel Transformer-VQ attention, the layer over
the torch ops favor::sequence_parallel_vq_attention(_backward) (favor/ops/sequence_parallel).

Every rank holds a contiguous slice of the sequence (rank order = sequence order); the forward
pass exchanges the per-code key sums, the backward pass those and the query-side per-code sums.
The arguments are favor.torch.vq_attention's (favor/ops/vq), checked the same way.
"""
import torch

from .. import _args
from .._args import block_length
from ..ops import _tensors as T
from ..ops.sequence_parallel import exchange_handle, sequence_parallel_vq_attention_op
from ..ops.vq import check_codebook
from ._agreement import agreed, flag
from .function import resolve_exchange


@T.names_key_padding_mask
def vq_attention(q, k, v, codebook, *, causal=False, scale=None, key_padding_mask=None,
                 tau=0.0, block=None, group=None, exchange=None):
    """Differentiable sequence-parallel Transformer-VQ attention on CPU tensors: this rank's
    slice of favor.torch.vq_attention on the whole sequence.

    q [B, H, Nq_r, D], k [B, H, Nk_r, D], v [B, H, Nk_r, Dv] (or [N_r, D]): rank r's
    contiguous slice of the sequence (rank order = sequence order; any length, also 0) ->
    y [B, H, Nq_r, Dv] in the dtype of q. codebook [c, D] or [H or 1, c, D]: the same values
    on every rank (a replicated parameter or buffer). Bidirectional: every query sees every
    rank's keys; causal: Nq_r = Nk_r and queries see the keys before them on every rank.
    tau = 0: hard VQ, tau > 0: soft VQ. key_padding_mask [B, Nk_r]: this rank's keys,
    torch's convention (True or -inf = ignore the key). block: the causal block length (may
    differ between ranks; the result does not depend on it). Per call and rank the forward
    moves the per-code key sums, B H c (Dv + 1) floats, whatever N.

    causal, scale, tau, the codebook's values and the presence of a mask must be the same on
    every rank (the ranks compare a fingerprint of shapes, options and codebook, and raise
    the same error otherwise, also for an argument refused here on one rank).

    group: the torch.distributed process group (None: the default; gloo) the slices are
    spread over; or exchange: a favor.distributed.Exchange (MPIExchange, TorchExchange).

    Backward (collective: every rank must run it, so every rank's loss must depend on y):
    dq, dk, dv of this rank's slice, as favor.torch.vq_attention's (dk straight-through for
    hard VQ, exact for soft VQ), and, when the codebook requires grad (on every rank alike),
    this rank's share of dL/dC: sum it over ranks (torch.distributed.all_reduce of the
    codebook's .grad after backward), as for every other parameter of a model whose sequence
    is split. The last call's favor._core.SequenceParallelStats are kept on the exchange as
    forward_stats and backward_stats.
    """
    ex = resolve_exchange(exchange, group, vq=True)

    def prepare():  # inside agreed: the other ranks are in the call and raise its error too
        for t, name in ((q, "q"), (k, "k"), (v, "v")):
            T.check_tensor(t, name)
        check_codebook(codebook)
        return (T.as_float32(q, "q"), T.as_float32(k, "k"), T.as_float32(v, "v"),
                T.as_float32(codebook, "codebook"), T.check_mask(key_padding_mask),
                flag(causal, "causal"), _args.optional_number(scale, "scale"),
                _args.number(tau, "tau"), block_length(block))

    y = sequence_parallel_vq_attention_op(*agreed(ex, prepare, vq=True), exchange_handle(ex))
    return y if q.dtype == torch.float32 else y.to(q.dtype)
