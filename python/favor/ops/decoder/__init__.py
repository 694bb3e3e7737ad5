"""favor::decode_step: one step of FAVOR's streaming decoder as a torch op on one decoding
state (DecodeState), advanced in place (advance) or functionally (decode_step)."""
from .op import DecodeState, advance, decode_step, decode_step_op, empty_state

__all__ = ["DecodeState", "advance", "decode_step", "decode_step_op", "empty_state"]
