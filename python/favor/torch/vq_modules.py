"""favor.torch.VQAttention: multi-head Transformer-VQ attention as a module, by composition:
the multi-head machinery (MultiHeadModule: q/k/v/out projections, heads, forward, step)
around a favor.torch.VQCore, owned as `core`, which holds the codebook state and the VQ
configuration (their names on the layer: _core_attributes.py)."""
from ._core_attributes import VQAttributes
from ._multihead import MultiHeadModule
from .vq_core import VQCore


class VQAttention(VQAttributes, MultiHeadModule):
    """Multi-head Transformer-VQ attention: q/k/v/out projections, one codebook per head.

    VQAttention(embed_dim, num_heads, codes, *, causal=False, tau=0.0, decay=0.99,
                dead_after=50, beta=0.25, learn_codebook='ema', scale=None, block=None,
                seed=0, kmeans_iterations=25, bias=True, batch_first=True, kdim=None,
                vdim=None, device=None, dtype=None)

    forward(query [B, Nq, E], key=None, value=None, key_padding_mask=None) -> [B, Nq, E]
    ([N, B, E] with batch_first=False; key_padding_mask [B, Nk], True = ignore).
    The codebook [H, codes, E / H] is initialised by k-means on the keys of the first
    forward call (initialise_codebook(k) does it explicitly). learn_codebook='ema': after
    each training-mode forward an EMA update (decay) moves the codes to the means of their
    keys, and codes that got no key for dead_after batches are re-seeded from keys;
    'grad': the codebook is a Parameter trained by the optimiser through dL/dC.
    After each forward, `commitment_loss` is beta * mean |k - sg(C_z)|^2 (a differentiable
    scalar; 'grad' adds mean |sg(k) - C_z|^2): add it to the training loss. dead_codes():
    codes no key of the latest training batch chose. tau > 0: soft VQ.
    The attention is `core`, a favor.torch.VQCore; its attributes and methods are the
    layer's too (codebook, ema_sum, ema_count, unused, initialised, updates, codes, tau,
    decay, beta, scale, ...; state_dict keys core.codebook, core.ema_sum, ...; a state_dict
    with the flat keys of before the core, codebook, ..., loads).
    For generation: decoder(batch) and step(x, decoder). torch.compile(fullgraph=True)
    traces it in training (initialisation and codebook learning included) and eval mode;
    torch.export an eval-mode module after one forward (k-means).
    """

    def __init__(self, embed_dim, num_heads, codes, *, causal=False, tau=0.0, decay=0.99,
                 dead_after=50, beta=0.25, learn_codebook="ema", scale=None, block=None, seed=0,
                 kmeans_iterations=25, bias=True, batch_first=True, kdim=None, vdim=None,
                 device=None, dtype=None, backend=None):
        super().__init__()
        self._init_heads(embed_dim, num_heads, causal, bias, kdim, vdim, device, dtype,
                         batch_first)
        self.core = VQCore(num_heads, self.head_dim, codes, causal=causal, tau=tau, decay=decay,
                           dead_after=dead_after, beta=beta, learn_codebook=learn_codebook,
                           scale=scale, block=block, seed=seed,
                           kmeans_iterations=kmeans_iterations, device=device, backend=backend)

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, codes={self.codes}, "
                f"causal={self.causal}, tau={self.tau}, learn_codebook={self.learn_codebook}")
