"""Transformer-VQ in the numpy API (docs/vq.md, docs/python.md "Transformer-VQ").

Keys are quantised to a codebook of c codes per head; softmax attention over the quantised
keys is then linear in N exactly. Codebooks are [c, D] (one for every head) or [H, c, D]
(one per head; [1, c, D] is shared), float32 (other float dtypes are converted; codebooks
are small). tau = 0 is hard VQ (nearest code), tau > 0 soft VQ (p(s|k) = softmax_s(-|k -
C_s|^2 / tau)). Bad input raises favor.Error (a ValueError) naming the argument.
"""
from collections import namedtuple

import numpy as np

from . import _core
from ._args import Streaming, block_length, mix_seed

VQGrads = namedtuple("VQGrads", ["dq", "dk", "dv", "dcodebook"])
VQGrads.__doc__ = """dL/dq, dL/dv (exact), dL/dk (straight-through for hard VQ: the gradient of
the quantised key; exact through p(s|k) for soft VQ) and dL/dcodebook (the codebook's shape,
or None unless codebook_grad=True)."""
VQOutput = namedtuple("VQOutput", ["y", "zero_rows"])
VQOutput.__doc__ = "vq_attention(..., full_output=True): y and the number of all-zero rows."
Commitment = namedtuple("Commitment", ["loss", "dk"])
Commitment.__doc__ = "beta * mean_j |k_j - sg(C_z_j)|^2 (a float) and its gradient dL/dk."


def _values(codebook):
    """A Codebook's values, or the array itself."""
    return codebook.values if isinstance(codebook, Codebook) else codebook


def vq_attention(q, k, v, codebook, *, causal=False, scale=None, key_mask=None, tau=0.0,
                 block=None, full_output=False):
    """Transformer-VQ attention: softmax(scale q.k^) v over the quantised keys k^ (hard
    VQ), or the soft-VQ mixture with tau > 0, in O(N c (D + Dv)) time.

    q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv] (or 2-D [N, D]) -> y [B, H, Nq, Dv];
    codebook [c, D], [H or 1, c, D] or a favor.Codebook. causal: query i sees keys j <= i
    (computed in blocks of `block` tokens: direct attention inside a block, per-code sums
    of the earlier ones; the result does not depend on block). key_mask [B, Nk]: nonzero =
    the key takes part. Rows with no visible key are zeros (full_output=True returns
    VQOutput(y, zero_rows))."""
    y, zero_rows = _core.vq_attention(q, k, v, _values(codebook), causal=causal, scale=scale,
                                      key_mask=key_mask, tau=float(tau),
                                      block=block_length(block))
    return VQOutput(y, zero_rows) if full_output else y


def vq_attention_backward(q, k, v, dy, codebook, *, causal=False, scale=None, key_mask=None,
                          tau=0.0, block=None, codebook_grad=False):
    """Gradients of vq_attention() for dy = dL/dy: VQGrads(dq, dk, dv, dcodebook).
    Causal gradients are exact through the whole prefix (no truncation at blocks)."""
    return VQGrads(*_core.vq_attention_backward(
        q, k, v, dy, _values(codebook), causal=causal, scale=scale, key_mask=key_mask,
        tau=float(tau), block=block_length(block), codebook_grad=codebook_grad))


def vq_assign(k, codebook, *, distances=False):
    """The nearest code of every key (ties to the lowest index): int32 [B, H, N] ([N] for
    2-D k); with distances=True, (codes, |k - C_z|^2 as float32 of the same shape)."""
    codes, dist = _core.vq_assign(k, _values(codebook), distances=distances)
    return (codes, dist) if distances else codes


def commitment_loss(k, codebook, beta=0.25, key_mask=None):
    """Commitment(loss, dk): beta * mean over the (unmasked) keys of |k - sg(C_z)|^2 and its
    gradient with respect to k (zero for masked keys)."""
    return Commitment(*_core.commitment_loss(k, _values(codebook), beta=float(beta),
                                             key_mask=key_mask))


class Codebook:
    """A codebook [H, c, D] (float32) with its EMA training state.

    Codebook(values [c, D] or [H, c, D]): EMA sums start at the values and counts at 1.
    Codebook.kmeans(k, codes, ...): k-means++ then Lloyd on keys [B, H, N, D]; `history`
    holds the mean quantisation error after the seeding and after every iteration.
    ema_update(k, ...): one EMA step (codes unused for `dead_after` updates are re-seeded
    from keys of this call); returns how many were. save(path) / Codebook.load(path): the
    values as .npy (the EMA state restarts on load, as for a new Codebook).
    """

    def __init__(self, values, *, seed=0):
        a = np.asarray(values)
        if a.ndim not in (2, 3) or a.dtype.kind != "f":
            raise _core.Error(f"values: shape {list(a.shape)} and dtype {a.dtype} must be a float "
                              "array [c, D] or [H, c, D]")
        if a.ndim == 2:
            a = a[None]
        if min(a.shape) < 1:
            raise _core.Error(f"values: shape {list(a.shape)} has an empty axis")
        if not np.all(np.isfinite(a)):
            raise _core.Error("values: has a non-finite entry")
        self._values = np.array(a, dtype=np.float32, order="C")
        self._sum = self._values.copy()
        self._count = np.ones(self._values.shape[:2], dtype=np.float32)
        self._unused = np.zeros(self._values.shape[:2], dtype=np.int64)
        self.seed, self.updates, self.history = seed, 0, []

    @classmethod
    def kmeans(cls, k, codes, *, iterations=25, seed=0, per_head=True, key_mask=None,
               verbose=False):
        """k-means++ seeding (drawn with `seed`) and `iterations` Lloyd iterations on keys
        k [B, H, N, D] (or [N, D]): one codebook per head, or one for all heads with
        per_head=False. Refuses more codes than (unmasked) keys per codebook."""
        values, history = _core.codebook_kmeans(k, codes, iterations=iterations, seed=seed,
                                                per_head=per_head, key_mask=key_mask)
        book = cls(values, seed=seed)
        book.history = list(history)
        if verbose:
            for i, e in enumerate(book.history):
                print(f"k-means iteration {i:3d}: mean squared error {e:.6g}")
        return book

    @property
    def values(self):
        """The codebook [H, c, D] (a read-only view; it changes with ema_update)."""
        v = self._values.view()
        v.flags.writeable = False
        return v

    heads = property(lambda self: self._values.shape[0])
    codes = property(lambda self: self._values.shape[1])
    d = property(lambda self: self._values.shape[2])

    @property
    def unused(self):
        """[H, c] int64: consecutive EMA updates each code went unused (a copy)."""
        return self._unused.copy()

    def ema_update(self, k, *, decay=0.99, dead_after=50, key_mask=None):
        """One EMA step on keys k [B, H, N, D]; returns the number of codes re-seeded."""
        reset = _core.codebook_ema_update(self._values, self._sum, self._count, self._unused, k,
                                          decay=decay, dead_after=dead_after,
                                          seed=mix_seed(self.seed, self.updates),
                                          key_mask=key_mask)
        self.updates += 1
        return reset

    def quantisation_error(self, k, key_mask=None):
        """Mean |k - C_z|^2 over the (unmasked) keys, in double; 0.0 when every key is
        masked."""
        _, dist = _core.vq_assign(k, self._values, distances=True)
        dist = dist.astype(np.float64)
        if key_mask is None:
            return float(dist.mean())
        keep = np.asarray(key_mask) != 0
        if dist.ndim == 3:
            keep = np.broadcast_to(keep[:, None, :], dist.shape)
        # No unmasked key: no error (0.0, as favor::Codebook::quantisation_error).
        return float(dist[keep].mean()) if keep.any() else 0.0

    def save(self, path):
        """Saves the values [H, c, D] as a .npy file."""
        np.save(path, self._values)

    @classmethod
    def load(cls, path):
        """A Codebook with the values a save() wrote (EMA state restarted)."""
        return cls(np.load(path, allow_pickle=False))

    def __repr__(self):
        return (f"favor.Codebook(heads={self.heads}, codes={self.codes}, d={self.d}, "
                f"updates={self.updates})")


class VQDecoder(Streaming):
    """Streaming Transformer-VQ decoding: per (batch, head) a per-code value sum and count.

    VQDecoder(batch, heads, dv, codebook, *, scale=None, tau=0.0) (the codebook is copied);
    append(k [B, H, T, D], v [B, H, T, Dv]); query(q [B, H, T, D]) -> [B, H, T, Dv]: query
    after appending tokens 0..i equals row i of causal vq_attention, at O(c (D + Dv)) per
    token and head whatever the position. state_bytes does not grow with position.
    """

    def __init__(self, batch, heads, dv, codebook, *, scale=None, tau=0.0):
        self._d = _core.VQDecoder(batch, heads, dv, _values(codebook), scale=scale,
                                  tau=float(tau))

    codes = property(lambda self: self._d.codes)
    state_bytes = property(lambda self: self._d.state_bytes,
                           doc="bytes of state (per-code sums and counts): fixed")

    def __repr__(self):
        return (f"favor.VQDecoder(batch={self.batch}, heads={self.heads}, dv={self.dv}, "
                f"codes={self.codes}, position={self.position})")
