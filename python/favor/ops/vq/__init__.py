"""favor::vq_attention: Transformer-VQ attention (keys quantised to a codebook; hard or soft)
as a torch op with its backward; naive.py is its oracle."""
from .op import check_codebook, vq_attention, vq_attention_backward_op, vq_attention_op

__all__ = ["check_codebook", "vq_attention", "vq_attention_backward_op", "vq_attention_op"]
