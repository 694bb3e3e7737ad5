"""favor's codebook learning (Transformer-VQ) as torch ops on the codebook buffers:
favor::vq_assign, ::codebook_initialise, ::codebook_ema_update, ::codebook_track_usage."""
from .op import (codebook_ema_update_op, codebook_initialise_op, codebook_track_usage_op,
                 int64_seed, vq_assign_op)

__all__ = ["codebook_ema_update_op", "codebook_initialise_op", "codebook_track_usage_op",
           "int64_seed", "vq_assign_op"]
