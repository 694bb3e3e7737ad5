"""favor.torch.VQMultiheadAttention: torch.nn.MultiheadAttention's interface computed by
Transformer-VQ (what convert(model, method='vq') puts in)."""
from torch import nn

from .mha import MultiheadAttention
from .vq_codebook import CodebookMixin


class VQMultiheadAttention(CodebookMixin, MultiheadAttention):
    # CodebookMixin comes first: its attend/_prepare/_learn replace FAVOR's.
    """torch.nn.MultiheadAttention's constructor, parameters and forward (as
    favor.torch.MultiheadAttention: same refusals) with Transformer-VQ attention.

    VQMultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                         add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
                         device=None, dtype=None, *, codes=64, causal=False, tau=0.0,
                         decay=0.99, dead_after=50, beta=0.25, learn_codebook='ema',
                         scale=None, block=None, seed=0, kmeans_iterations=25)

    The codebook buffers, k-means initialisation on the first batch, EMA learning,
    commitment_loss and dead_codes() are VQAttention's. A state_dict of torch's module
    loads (the codebook is then initialised on the first forward).
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None, *, codes=64, causal=False, tau=0.0, decay=0.99, dead_after=50,
                 beta=0.25, learn_codebook="ema", scale=None, block=None, seed=0,
                 kmeans_iterations=25, warn_dropout=True):
        nn.Module.__init__(self)  # not MultiheadAttention's: no projection to draw
        self._init_torch(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, device, dtype, warn_dropout)
        self.causal, self.scale, self.method = causal, scale, "vq"
        self.feature_redraw_interval = None
        self._init_codebook(codes, tau=tau, decay=decay, dead_after=dead_after, beta=beta,
                            learn_codebook=learn_codebook, seed=seed, block=block,
                            kmeans_iterations=kmeans_iterations, device=device)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"batch_first={self.batch_first}, codes={self.codes}, tau={self.tau}, "
                f"learn_codebook={self.learn_codebook}")
