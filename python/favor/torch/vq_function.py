"""favor.torch.vq_attention (the op favor::vq_attention, favor/ops/vq) and VQDecoder:
Transformer-VQ with torch tensors."""
import torch

from .. import _core
from ..ops import _tensors as T
from ..ops.decoder.vq import VQDecodeState, empty_vq_state, vq_advance
from ..ops.vq import check_codebook, vq_attention  # noqa: F401


class VQDecoder:
    """Streaming Transformer-VQ state per (batch, head), for generation with torch tensors: a
    thin owner of one VQDecodeState (favor.ops.decoder.vq), advanced by the op
    favor::vq_decode_step on the device of the tensors it is given (the state follows them).

    VQDecoder(batch, heads, dv, codebook, *, scale=None, tau=0.0, backend=None): the codebook
    tensor ([c, D] or [H, c, D]) is copied. append(k [B, H, T, D], v [B, H, T, Dv]); query(q
    [B, H, T, D]) -> [B, H, T, Dv] (float32; no autograd): query after appending tokens
    0..i equals row i of causal vq_attention. state_bytes is fixed whatever the position.
    """

    def __init__(self, batch, heads, dv, codebook, *, scale=None, tau=0.0, backend=None):
        check_codebook(codebook)
        self.backend = T.check_backend(backend)
        self._codebook = T.as_float32(codebook.detach(), "codebook").cpu().clone()
        # the C++ decoder checks the codebook and options and lends them to the CPU kernel
        self._d = _core.VQDecoder(batch, heads, dv, T.view(self._codebook), scale=scale,
                                  tau=float(tau))
        self._scale, self._tau = scale, float(tau)
        self._state = empty_vq_state(batch, heads, dv, self._d.codes, device="cpu")

    codes = property(lambda self: self._d.codes)
    batch = property(lambda self: int(self._state.sums.shape[0]))
    position = property(lambda self: int(self._state.position[0]), doc="tokens appended so far")
    state_bytes = property(lambda self: sum(t.numel() * t.element_size()
                                            for t in self._state[:2]))

    def _run(self, q, k, v, key_mask, mode):
        ref = q if q is not None else k
        T.check_device(ref, "q" if q is not None else "k")
        if self._state.sums.device != ref.device:  # the state follows the tensors
            self._state = VQDecodeState(*(t.to(ref.device) for t in self._state))
        if key_mask is not None and not isinstance(key_mask, torch.Tensor):
            key_mask = torch.as_tensor(key_mask)
        if q is None:
            q = k[:, :, :0]
        if k is None:
            k = q[:, :, :0]
            v = q.new_zeros((*q.shape[:2], 0, self._d.dv))
        return vq_advance(self._state, q, k, v, self._codebook, mode=mode, scale=self._scale,
                          tau=self._tau, key_mask=key_mask, backend=self.backend,
                          decoder=self._d)

    def append(self, k, v, key_mask=None):
        """Adds T tokens; key_mask [B, T] (nonzero = the token takes part): a masked token
        adds nothing to its row."""
        self._run(None, k, v, key_mask, "append")

    def query(self, q):
        return self._run(q, None, None, None, "query")

    def step(self, q, k, v, key_mask=None):
        """One decode step of every row (append then query; fused on the CPU)."""
        return self._run(q, k, v, key_mask, "step")

    def prefill(self, q, k, v, key_mask=None):
        """Causal attention over a prompt from the current state, leaving the state append
        leaves (on the CPU one C++ call that assigns each key once)."""
        return self._run(q, k, v, key_mask, "prefill")

    def reset(self):
        for t in self._state:
            t.zero_()

    def state(self):
        """A copy of the state: {'sums', 'counts'} tensors on the state's device and the int
        'position'; load_state(**state) restores it."""
        sums, counts, position = self._state
        return dict(sums=sums.clone(), counts=counts.clone(), position=int(position[0]))

    def load_state(self, **state):
        """Replaces the state (checked by the C++ rules: shapes and values)."""
        self._d.load_state(**{name: value.detach().cpu().contiguous().numpy()
                              if isinstance(value, torch.Tensor) else value
                              for name, value in state.items()})
        st = self._d.state()
        self._d.reset()
        sums = state.get("sums")
        device = sums.device if isinstance(sums, torch.Tensor) else torch.device("cpu")
        self._state = VQDecodeState(torch.from_numpy(st["sums"]).to(device),
                                    torch.from_numpy(st["counts"]).to(device),
                                    torch.tensor([st["position"]], dtype=torch.int64,
                                                 device=device))

    def select(self, indices):
        """Keeps batch rows indices in that order (a beam search's reorder)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().reshape(-1).tolist()
        self._d.select(list(indices))  # the C++ rule (row range)
        self._d.reset()
        idx = torch.as_tensor(list(indices), dtype=torch.int64, device=self._state.sums.device)
        sums, counts, position = self._state
        self._state = VQDecodeState(sums[idx], counts[idx], position.clone())
