"""Hybrid attention (exact softmax on a window of the last `window` keys and on `sinks` sink
keys, FAVOR's estimator on every other key, one normaliser; docs/math.md, "Hybrid attention")
in fla's layout, one folder for what it adds to the estimator:

    naive.py      the float64 oracle: every score materialised (tests' reference)
    chunk.py      the torch path of a whole sequence: the band in blocks, the estimated parts
                  as causal FAVOR in the window-shifted frame, the merge in log space
                  (favor::attention's default kernel with window or sinks; the window alone
                  for favor::exact_attention)
    recurrent.py  the torch path of the streaming decoder: favor::hybrid_decode_step's
                  default kernel on the HybridDecodeState
    op.py         favor::hybrid_decode_step (HybridDecodeState, empty_hybrid_state, advance):
                  CPU the C++ HybridDecoder on a view of the state (the window alone: the
                  ring in torch, a prompt on C++'s band kernel), CUDA triton/decode.py
    triton/       band.py (the exact part of a forward on CUDA), decode.py (one fused step)

The batch forward stays one op with the estimator (favor::attention's `window` and `sinks`,
bound from C++'s AttentionOptions and its rules, so that a hybrid call and a plain one share
the kernel names, the maps, the masks and the saved context); what is hybrid's own lives here.
"""
from .op import HybridDecodeState, empty_hybrid_state, hybrid_decode_step_op
from .op import advance as hybrid_advance

__all__ = ["HybridDecodeState", "empty_hybrid_state", "hybrid_advance", "hybrid_decode_step_op"]
