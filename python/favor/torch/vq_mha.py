"""favor.torch.VQMultiheadAttention: torch.nn.MultiheadAttention's interface computed by
Transformer-VQ (what convert(model, method='vq') puts in), by composition: torch's
parameters, checks and forward (TorchMultihead, _torch_multihead.py) around a
favor.torch.VQCore, owned as `core` (its attributes on the layer: _core_attributes.py)."""
from ._core_attributes import VQAttributes
from ._torch_multihead import TorchMultihead
from .vq_core import VQCore


class VQMultiheadAttention(VQAttributes, TorchMultihead):
    """torch.nn.MultiheadAttention's constructor, parameters and forward (as
    favor.torch.MultiheadAttention: same refusals) with Transformer-VQ attention.

    VQMultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                         add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
                         device=None, dtype=None, *, codes=64, causal=False, tau=0.0,
                         decay=0.99, dead_after=50, beta=0.25, learn_codebook='ema',
                         scale=None, block=None, seed=0, kmeans_iterations=25)

    The attention is `core`, a favor.torch.VQCore: the codebook buffers (state_dict keys
    core.codebook, core.ema_sum, ...), k-means initialisation on the first batch, EMA
    learning, commitment_loss and dead_codes(), as VQAttention's, with its attributes on the
    layer. A state_dict of torch's module loads (the codebook is then initialised on the
    first forward); one with the flat keys of before the core (codebook, ...) too.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, codes=64, causal=False, tau=0.0, decay=0.99, dead_after=50,
                 beta=0.25, learn_codebook="ema", scale=None, block=None, seed=0,
                 kmeans_iterations=25, warn_dropout=True, backend=None):
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, device, dtype, warn_dropout, causal)
        self.core = VQCore(num_heads, self.head_dim, codes, causal=causal, tau=tau, decay=decay,
                           dead_after=dead_after, beta=beta, learn_codebook=learn_codebook,
                           scale=scale, block=block, seed=seed,
                           kmeans_iterations=kmeans_iterations, device=device, backend=backend)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}, codes={self.codes}, tau={self.tau}, "
                f"learn_codebook={self.learn_codebook}")
