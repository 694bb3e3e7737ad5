"""favor::exact_attention: favor's exact softmax attention (the O(N^2) baseline, streamed and
stabilised in C++) as a torch op; naive.py is its oracle."""
from .op import exact_attention, exact_attention_backward_op, exact_attention_op

__all__ = ["exact_attention", "exact_attention_backward_op", "exact_attention_op"]
