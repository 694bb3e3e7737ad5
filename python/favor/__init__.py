"""favor: fast random-feature attention (FAVOR+ and its family) on the CPU.

The numpy API mirrors the C++ library and the ``favor`` command line (same option names):

    import numpy as np, favor
    q, k, v = (np.random.randn(2, 4, 1024, 64).astype(np.float32) for _ in range(3))
    y = favor.attention(q, k, v, causal=True, features=256, seed=0)     # [2, 4, 1024, 64]

Arrays are ``[B, H, N, D]`` or ``[N, D]`` (one head). float32 arrays are used in place
(strided views too); float64 is converted once. Outputs are new float32 arrays. Bad input
raises :class:`favor.Error` (a ``ValueError``) with the C++ library's one-line message. The
GIL is released while favor computes. PyTorch: ``favor.torch``. One sequence split over
processes (torch.distributed or mpi4py): ``favor.distributed``. Docs: docs/python.md.
"""
from . import _core
from ._core import AttentionContext, Error, KernelFit, Projection, bf16_available, kernel_info
from ._core import num_threads, optimal_a, relative_frobenius_error, release_freed_memory
from ._threads import build_info, set_num_threads
from .api import (AttentionOutput, Decoder, FeatureMapGrads, Grads, attention,
                  attention_backward, exact_attention, exact_attention_backward, features,
                  fit_kernel, kernel_mse, make_projection)
from .feature_map import FeatureMap
from .fit import fit_features
from .vq import (Codebook, Commitment, VQDecoder, VQGrads, VQOutput, commitment_loss,
                 vq_assign, vq_attention, vq_attention_backward)

__version__ = _core.__version__
reference = _core.reference

__all__ = [
    "AttentionContext", "AttentionOutput", "Decoder", "Error", "Grads", "KernelFit", "Projection",
    "attention", "attention_backward", "bf16_available", "build_info", "exact_attention",
    "exact_attention_backward", "features", "fit_kernel", "kernel_info", "kernel_mse",
    "make_projection", "num_threads", "optimal_a", "reference", "relative_frobenius_error",
    "release_freed_memory", "set_num_threads",
    # learned feature maps (favor/feature_map.py, favor/fit.py; fit_features needs torch)
    "FeatureMap", "FeatureMapGrads", "fit_features",
    # Transformer-VQ (favor/vq.py)
    "Codebook", "Commitment", "VQDecoder", "VQGrads", "VQOutput", "commitment_loss",
    "vq_assign", "vq_attention", "vq_attention_backward",
]
