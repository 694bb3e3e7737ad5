"""favor.torch.Decoder: token-by-token generation with torch tensors."""
import numpy as np
import torch

from .. import _core, api
from ..ops.attention.canonical import canonical_map
from ..ops.decoder import generic
from ..ops.decoder.op import check_key_mask
from .._args import fit_for
from . import _tensors as T


class _Streaming:
    """What Decoder and VQDecoder share: calls of the _core decoder held in self._d with
    torch tensors (float32 views in, a tensor sharing the result's memory out)."""

    def append(self, k, v, key_mask=None):
        """Adds T tokens; key_mask [B, T] (nonzero = the token takes part) leaves a masked
        token's row as it was, so left-padded batches generate."""
        T.follow_torch_threads()
        keep = key_mask.detach().cpu().ne(0).numpy() if isinstance(key_mask, torch.Tensor) \
            else key_mask
        self._d.append(T.view(T.as_float32(k, "k").cpu()), T.view(T.as_float32(v, "v").cpu()),
                       key_mask=keep)

    def query(self, q):
        """[B, H, T, Dv] float32 on q's device (the C++ state lives on the host: tensors on
        another device are copied, as VQDecoder does; Decoder keeps its state on the
        device instead)."""
        T.follow_torch_threads()
        y = T.tensor(self._d.query(T.view(T.as_float32(q, "q").cpu())))
        return y if q.device.type == "cpu" else y.to(q.device)

    def step(self, q, k, v, key_mask=None):
        """One decode step of every row: append(k, v, key_mask) then query(q) (q/k
        [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]) in one fused C++ pass."""
        T.follow_torch_threads()
        y = T.tensor(self._d.step(*_cpu_views(q, k, v), key_mask=_keep(key_mask)))
        return y if q.device.type == "cpu" else y.to(q.device)

    def prefill(self, q, k, v, key_mask=None):
        """Causal attention over a prompt q, k [B, H, T, D], v [B, H, T, Dv] from the current
        state -> [B, H, T, Dv], leaving the state append(k, v, key_mask) leaves: one C++ call
        that computes the key features (VQ: codes) once."""
        T.follow_torch_threads()
        y = T.tensor(self._d.prefill(*_cpu_views(q, k, v), key_mask=_keep(key_mask)))
        return y if q.device.type == "cpu" else y.to(q.device)

    def reset(self):
        self._d.reset()

    def state(self):
        """A copy of the state as CPU tensors and the int 'position' (Decoder: sums, log_max,
        row_positions; VQDecoder: sums, counts; docs/api.md, "Decoder state");
        load_state(**state) restores it, on this decoder or a fresh one of the same shape
        (bit for bit)."""
        return {name: value if name == "position" else T.tensor(value)
                for name, value in self._d.state().items()}

    def load_state(self, **state):
        """Replaces the state by tensors or arrays as state() returns them (checked; a tensor
        on another device is copied to the CPU)."""
        self._d.load_state(**{name: value.detach().cpu().contiguous().numpy()
                              if isinstance(value, torch.Tensor) else value
                              for name, value in state.items()})

    def select(self, indices):
        """Keeps batch rows indices (a list or an int tensor), in that order: the reorder of a
        beam search (rows may repeat or be dropped)."""
        if isinstance(indices, torch.Tensor):
            indices = indices.detach().cpu().reshape(-1).tolist()
        self._d.select(list(indices))

    position = property(lambda self: self._d.position, doc="tokens appended so far")
    batch = property(lambda self: self._d.batch)
    state_bytes = property(lambda self: self._d.state_bytes)


class Decoder(_Streaming):
    """Streaming FAVOR state per (batch, head), for generation with torch tensors.

    Decoder(batch, heads, dv, projection=None, *, kernel='positive', scale=None, fit=None,
            feature_map=None, decay=None):
    projection is a favor.Projection or a float [m, D] tensor; or give a favor.FeatureMap
    (learned maps; FavorAttention.feature_map()) instead; decay: gamma per head (the state
    decays by gamma at every appended token). append(k [B, H, T, D],
    v [B, H, T, Dv]); query(q [B, H, T, D]) -> [B, H, T, Dv] (float32; no autograd) reads
    the current state: query after appending tokens 0..i equals row i of causal
    attention. The state has a fixed size (state_bytes) whatever the position.
    """

    def __init__(self, batch, heads, dv, projection=None, *, kernel="positive", scale=None,
                 fit=None, feature_map=None, decay=None, backend=None):
        self.backend = T.check_backend(backend)
        self._on_device = None  # the state as tensors once a non-CPU path runs (_DeviceState)
        self._map = (projection, kernel, scale, fit, feature_map, decay)
        if isinstance(projection, torch.Tensor):
            projection = T.projection_matrix(projection.detach(), projection.shape[-1])
        if feature_map is None and not isinstance(projection, _core.Projection):
            raise _core.Error("projection: must be a favor.Projection or an [m, D] tensor (or "
                              "give a feature_map)")
        if isinstance(decay, torch.Tensor):
            decay = decay.detach().double().reshape(-1).tolist()
        if feature_map is not None or decay is not None:
            # the numpy Decoder checks and builds the map (api.Decoder)
            self._d = api.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                  fit=fit, feature_map=feature_map, decay=decay)._d
            return
        self._d = _core.Decoder(batch, heads, dv, projection, kernel=kernel, scale=scale,
                                fit=fit_for(fit, kernel, projection.d, (batch, heads)))

    projection = property(lambda self: self._d.projection)

    def step(self, q, k, v, key_mask=None):
        """One decode step of every row: append(k, v, key_mask) then query(q) (q/k
        [B, H, 1, D], v [B, H, 1, Dv], key_mask [B, 1]); on the CPU in one fused C++ pass
        (Decoder::step), on another device the two calls."""
        if self._device_state(q) is not None:
            self.append(k, v, key_mask)
            return self.query(q)
        return super().step(q, k, v, key_mask)

    def prefill(self, q, k, v, key_mask=None):
        """Causal attention over a prompt q, k [B, H, T, D], v [B, H, T, Dv] from the
        current state -> [B, H, T, Dv], leaving the state append(k, v, key_mask) leaves; on
        the CPU one C++ call that computes the key features once (Decoder::prefill), on
        another device append and query token by token."""
        if self._device_state(q) is not None:
            rows = []
            for i in range(q.shape[2]):
                self.append(k[:, :, i:i + 1], v[:, :, i:i + 1],
                            None if key_mask is None else key_mask[:, i:i + 1])
                rows.append(self.query(q[:, :, i:i + 1]))
            return torch.cat(rows, dim=2)
        return super().prefill(q, k, v, key_mask)

    # A non-CPU path (tensors on another device, or backend 'torch' / 'triton') moves the
    # state into tensors on that device and runs favor::decode_step's torch path there
    # (ops/decoder/generic.py) on the C++ state layout; the C++ decoder keeps checking.
    def _device_state(self, t):
        if self._on_device is None and T.backend(t, "k", self.backend) != "cpu":
            self._on_device = _DeviceState(self, t.device)
        return self._on_device

    def append(self, k, v, key_mask=None):
        dev = self._device_state(k)
        if dev is None:
            return super().append(k, v, key_mask)
        self._check_step(k, "k", "D", self._d.projection.d)
        self._check_step(v, "v", "Dv", self._d.dv)
        if k.shape[2] != v.shape[2]:
            raise _core.Error(f"k {list(k.shape)}, v {list(v.shape)}: k and v must have the "
                              "same number of tokens T")
        if key_mask is not None:
            key_mask = torch.as_tensor(key_mask)
        check_key_mask(key_mask, self.batch, k.shape[2])
        dev.append(k, v, key_mask)

    def query(self, q):
        dev = self._device_state(q)
        if dev is None:
            return super().query(q)
        self._check_step(q, "q", "D", self._d.projection.d)
        return dev.query(q)

    def _check_step(self, t, name, dim_name, dim):
        """The C++ decoder's rule for a step's tensor (its message): [B, H, T, dim], finite."""
        T.check_tensor(t, name)
        b, h = self.batch, self._d.heads
        if t.dim() != 4 or t.shape[0] != b or t.shape[1] != h or t.shape[3] != dim:
            raise _core.Error(f"{name}: shape [{','.join(map(str, t.shape))}] must be [B, H, T, "
                              f"{dim_name}] = [{b},{h},T,{dim}]")
        T.check_finite(t, name)

    def reset(self):
        super().reset()
        self._on_device = None

    def state(self):
        """A copy of the state: CPU tensors (the C++ state), or tensors on the device once
        a non-CPU path holds it; load_state takes either."""
        if self._on_device is None:
            return super().state()
        sums, log_max, rows, position = self._on_device.state
        return dict(sums=sums.clone(), log_max=log_max.clone(), row_positions=rows.clone(),
                    position=int(position[0]))

    def load_state(self, **state):
        sums = state.get("sums")
        on_device = isinstance(sums, torch.Tensor) and \
            T.backend(sums, "sums", self.backend) != "cpu"   # refused before anything changes
        super().load_state(**state)  # the C++ checks of every field
        if on_device:
            self._on_device = _DeviceState(self, sums.device)
        elif self._on_device is not None:
            self._on_device = _DeviceState(self, self._on_device.device)

    def select(self, indices):
        super().select(indices)
        if self._on_device is not None:
            self._on_device.select(indices)

    position = property(lambda self: self._on_device.position if self._on_device is not None
                        else self._d.position, doc="tokens appended so far")


def _cpu_views(q, k, v):
    """float32 CPU views of a step's q, k, v for the C++ decoder."""
    return (T.view(T.as_float32(q, "q").cpu()), T.view(T.as_float32(k, "k").cpu()),
            T.view(T.as_float32(v, "v").cpu()))


def _keep(key_mask):
    """A key mask as the C++ decoder takes it (a bool array; None: every token)."""
    return key_mask.detach().cpu().ne(0).numpy() if isinstance(key_mask, torch.Tensor) \
        else key_mask


class _DeviceState:
    """A Decoder's state as tensors on a device (sums, log_max, row_positions, position),
    stepped by favor::decode_step's torch path under the decoder's canonical map."""

    def __init__(self, decoder, device):
        self.device = device
        st = decoder._d.state()
        self.state = (torch.from_numpy(st["sums"]).to(device),
                      torch.from_numpy(st["log_max"]).to(device),
                      torch.from_numpy(st["row_positions"]).to(device),
                      torch.tensor([st["position"]], dtype=torch.int64, device=device))
        self.cm = _canonical(decoder, device)

    def append(self, k, v, key_mask):
        with torch.no_grad():
            self.state = generic.append(self.state, T.as_float32(k, "k").to(self.device),
                                        T.as_float32(v, "v").to(self.device), self.cm,
                                        None if key_mask is None else
                                        torch.as_tensor(key_mask).to(self.device))

    def query(self, q):
        with torch.no_grad():
            return generic.query(self.state, T.as_float32(q, "q").to(self.device), self.cm)

    def select(self, indices):
        idx = torch.as_tensor(list(indices) if not isinstance(indices, torch.Tensor) else
                              indices, dtype=torch.int64, device=self.device).reshape(-1)
        sums, log_max, rows, position = self.state
        self.state = (sums[idx], log_max[idx], rows[idx], position)

    position = property(lambda self: int(self.state[3][0]))


def _canonical(decoder, device):
    """The CanonicalMap of a Decoder's map (projection or feature map, fit, decay) on
    device (the C++ decoder built from the same arguments has checked them)."""
    projection, kernel, scale, fit, fm, decay = decoder._map
    if fm is not None:
        w, kernel, scale, fit = fm.projection, fm.kernel, fm.scale, fm.fit
        weights, bias, lam = fm.weights, fm.bias, fm.lambda_
    else:
        w = projection.detach() if isinstance(projection, torch.Tensor) else projection.matrix
        weights = bias = lam = None
    t = lambda a: None if a is None else torch.as_tensor(np.asarray(a), dtype=torch.float32,
                                                         device=device)
    w = torch.as_tensor(w, dtype=torch.float32).to(device)
    kf = fit_for(fit, kernel, w.shape[1], (decoder.batch, decoder._d.heads)) \
        if fit is not None else None
    fa = None if kf is None else torch.as_tensor(np.asarray(kf.a)).to(device)
    fb = None if kf is None else torch.as_tensor(np.asarray(kf.basis)).to(device)
    if isinstance(decay, torch.Tensor):
        decay = decay.detach().double().reshape(-1).tolist()
    gammas = None if decay is None else torch.tensor(
        np.asarray(decay, dtype=np.float64).reshape(-1), device=device)
    return canonical_map(w, t(weights), t(bias), t(lam), gammas, fa, fb, kernel, scale,
                         w.shape[1])
