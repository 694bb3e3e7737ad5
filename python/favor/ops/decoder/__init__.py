"""favor::decode_step: one step of FAVOR's streaming decoder as a pure torch op on state tensors
(favor.torch.Decoder keeps the state in a C++ object; this op takes and returns it)."""
from .op import decode_step, decode_step_op, empty_state

__all__ = ["decode_step", "decode_step_op", "empty_state"]
