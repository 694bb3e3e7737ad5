"""favor::decode_step (FAVOR), favor::hybrid_decode_step (hybrid attention) and
favor::vq_decode_step (Transformer-VQ): the streaming decoders as torch ops on one decoding
state each (DecodeState, HybridDecodeState, VQDecodeState), advanced in place (advance,
hybrid_advance, vq_advance) or functionally (decode_step)."""
from .hybrid import HybridDecodeState, empty_hybrid_state, hybrid_decode_step_op
from .hybrid import advance as hybrid_advance
from .op import DecodeState, advance, decode_step, decode_step_op, empty_state
from .vq import VQDecodeState, empty_vq_state, vq_advance, vq_decode_step_op

__all__ = ["DecodeState", "HybridDecodeState", "VQDecodeState", "advance", "decode_step",
           "decode_step_op", "empty_hybrid_state", "empty_state", "empty_vq_state",
           "hybrid_advance", "hybrid_decode_step_op", "vq_advance", "vq_decode_step_op"]
