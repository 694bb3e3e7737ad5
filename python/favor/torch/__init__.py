"""favor.torch: favor's attention for PyTorch (torch >= 2.4; any device: CPU tensors run the
C++ kernels, CUDA tensors the fused Triton kernels, others plain torch operations; backend=
forces one: docs/gpu.md).

- attention(q, k, v, ...): differentiable FAVOR (or exact) attention on [B, H, N, D] tensors,
  gradients for q, k, v and a projection tensor.
- FavorCore: the FAVOR attention core on [B, H, N, head_dim] tensors (projection, redraw
  policy, learned map and decay, kernel, fit), for any attention class to own after its own
  q/k/v projections; FavorAttention and MultiheadAttention own one as `core`.
- FavorAttention: a multi-head attention module (with decoder()/step() for generation).
- MultiheadAttention: a drop-in for torch.nn.MultiheadAttention.
- convert(model): replaces every nn.MultiheadAttention in a model, keeping its weights.
- Decoder: token-by-token streaming state with torch tensors.
- plain: the same estimators written in plain torch ops (oracle and benchmark baseline).
- vq_attention, VQCore, VQAttention, VQMultiheadAttention, VQDecoder: Transformer-VQ (keys
  quantised to learned codebooks; convert(model, method='vq') too). VQCore is the VQ
  attention core with its codebook state, owned as `core` by VQAttention and
  VQMultiheadAttention, for any attention class to own as FavorCore.

favor's thread count follows torch.get_num_threads() unless favor.set_num_threads was
called or FAVOR_NUM_THREADS is set. Docs: docs/python.md.
"""
from . import plain
from .convert import convert
from .decoder import Decoder
from .favor_core import FavorCore
from .hybrid_decoder import HybridDecoder
from .function import attention
from .masks import is_causal_mask
from .mha import MultiheadAttention
from .modules import FavorAttention
from .vq_function import VQDecoder, vq_attention
from .vq_core import VQCore
from .vq_mha import VQMultiheadAttention
from .vq_modules import VQAttention

__all__ = ["Decoder", "FavorAttention", "FavorCore", "HybridDecoder", "MultiheadAttention", "VQAttention", "VQCore",
           "VQDecoder", "VQMultiheadAttention", "attention", "convert", "is_causal_mask", "plain",
           "vq_attention"]
