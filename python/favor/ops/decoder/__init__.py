"""favor::decode_step (FAVOR) and favor::vq_decode_step (Transformer-VQ): the streaming
decoders as torch ops on one decoding state each (DecodeState, VQDecodeState), advanced in
place (advance, vq_advance) or functionally (decode_step). Hybrid attention's step,
favor::hybrid_decode_step, is ops/hybrid's."""
from .op import DecodeState, advance, decode_step, decode_step_op, empty_state
from .vq import VQDecodeState, empty_vq_state, vq_advance, vq_decode_step_op

__all__ = ["DecodeState", "VQDecodeState", "advance", "decode_step", "decode_step_op",
           "empty_state", "empty_vq_state", "vq_advance", "vq_decode_step_op"]
