"""favor::hybrid_decode_step: hybrid attention's streaming decoder (exact softmax on the last
`window` tokens and the first `sinks` kept ones, FAVOR's estimator on the rest, one
normaliser; docs/math.md, "Hybrid attention") as one torch op on one state
(HybridDecodeState), every mode of favor::decode_step.

The state is the C++ HybridDecoderState's layout as tensors (favor._core.hybrid_state_layout:
the plain DecodeState's four, then the ring and the sinks), advanced in place by the op (the
CPU kernel borrows its memory: HybridDecoderStateView, one fused C++ call per step), so its
owner keeps the same tensors from the first token to the last: favor.torch.HybridDecoder, the
Hugging Face cache layer (favor.hf), a compiled loop of your own (no host sync outside the
op). Kernels: CPU the C++ HybridDecoder on a view of the state; CUDA one token ('step') by one
fused Triton kernel (triton/decode.py: push + query in place, the position read on the
device), the other modes by plain torch operations (recurrent.py), every other device's
default. The window and the sinks alone (estimate=False, method='window') run the torch
operations on the CPU, with a prompt's attention on C++'s band kernel, and the Triton kernel
on CUDA.
"""
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ... import _core
from .. import _dispatch
from .. import _tensors as T
from ..attention import attention, paths
from ..attention.layout import decay_list, feature_map
from ..attention.op import eager_mode
from ..decoder.op import (_step_checks, built_decoder, check_projection, check_step_inputs,
                          op_map_args)
from . import recurrent as generic
from .chunk import pair_log_const


class HybridDecodeState(NamedTuple):
    """Hybrid attention's decoding state, one definition for every device and owner: the C++
    HybridDecoderState's layout (include/favor/hybrid_decoder.hpp) as tensors, which the CPU
    kernel reads and writes in place. The linear state of the tokens that left the window
    (sums [B, H, F, Dv + 1] float32, log_max [B, H] float64, row_positions [B] int64, as
    DecodeState's), position [1] int64 (the tokens seen), the ring of the last `window` tokens
    (ring_k [B, H, W, D], ring_v [B, H, W, Dv] float32; ring_keep, ring_sink [B, W] uint8: the
    token takes part, is a sink; slot t % W holds token t) and the sinks (sink_k [B, H, S, D],
    sink_v [B, H, S, Dv] float32, sink_pos [B, S] int64, -1: none yet). Fixed size."""
    sums: Tensor
    log_max: Tensor
    row_positions: Tensor
    position: Tensor
    ring_k: Tensor
    ring_v: Tensor
    ring_keep: Tensor
    ring_sink: Tensor
    sink_k: Tensor
    sink_v: Tensor
    sink_pos: Tensor


_FILLS = {"log_max": float("-inf"), "sink_pos": -1}


def empty_hybrid_state(batch, heads, dv, features, d, window, sinks, device=None):
    """The HybridDecodeState of a decoder with nothing appended, on device (features: F,
    favor._core.feature_count(kernel, m); 0 for the window and the sinks alone)."""
    layout = _core.hybrid_state_layout(batch, heads, features, d, dv, window, sinks)
    return HybridDecodeState(*(torch.full(shape, _FILLS.get(name, 0), device=device,
                                          dtype=getattr(torch, dtype))
                               for name, shape, dtype in layout))


def hybrid_decoder(batch, heads, dv, w, kernel, scale, fit_a, fit_basis, weights, bias, lam,
                   decay, window, sinks):
    """The favor._core.HybridDecoder of the op's map (it checks the map and lends it to the
    CPU kernel; it holds no state of its own)."""
    fm = feature_map(w, weights, bias, lam, fit_a, fit_basis, kernel, scale)
    return _core.HybridDecoder(batch, heads, dv, fm, window, sinks, decay=decay_list(decay))


def _torch_kernel(state, q, k, v, key_mask, w, kernel, scale, fit_a, fit_basis, weights, bias,
                  lam, decay, window, sinks, estimate, step_kind, prompt_backend="torch"):
    """The default kernel: plain torch operations on the state's tensors, in place (a prompt
    on an empty state: one attention call on prompt_backend's kernel, then the state built
    from its keys)."""
    st = HybridDecodeState(*state)
    check_step_inputs(q, k, v, key_mask, step_kind)
    cm = paths.device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale,
                          decay is not None)
    q, k, v = q.float(), k.float(), v.float()
    keep = torch.ones(k.shape[0], k.shape[2], dtype=torch.bool, device=k.device) \
        if key_mask is None else key_mask.to(k.device).ne(0)
    log_const = pair_log_const(kernel, w.shape[0], fit_a) if estimate else None
    sc = q.shape[-1] ** -0.5 if scale is None else float(scale)
    sizes = (cm, window, sinks, estimate)

    def append():
        if int(st.position[0]) == 0:
            generic.build(st, k, v, keep, *sizes)
        else:
            for i in range(k.shape[2]):
                generic.push(st, k[:, :, i:i + 1], v[:, :, i:i + 1], keep[:, i], *sizes)

    read = lambda x: generic.query(st, x, cm, sc, window, log_const)  # noqa: E731
    if step_kind == "append":
        append()
        return q.new_empty((*q.shape[:-1], v.shape[-1]))
    if step_kind == "query":
        return read(q)
    if step_kind == "append_query":
        append()
        return read(q)
    if step_kind == "prefill" and int(st.position[0]) == 0:  # a prompt: one attention call
        m = dict(method="window", scale=scale) if not estimate else dict(
            projection=w, kernel=kernel, scale=scale, weights=weights, bias=bias,
            feature_weights=lam, decay=decay,
            fit=None if fit_a is None else (fit_a, fit_basis))
        y = attention(q, k, v, causal=True, window=window, sinks=sinks, key_padding_mask=~keep,
                      backend=prompt_backend, **m)
        generic.build(st, k, v, keep, *sizes)
        return y
    rows = []
    for i in range(q.shape[2]):  # causal: token i reads the state after its own push
        generic.push(st, k[:, :, i:i + 1], v[:, :, i:i + 1], keep[:, i], *sizes)
        rows.append(read(q[:, :, i:i + 1]))
    return torch.cat(rows, 2)


@torch.library.custom_op("favor::hybrid_decode_step",
                         mutates_args=("sums", "log_max", "row_positions", "position", "ring_k",
                                       "ring_v", "ring_keep", "ring_sink", "sink_k", "sink_v",
                                       "sink_pos"),
                         device_types=None)
def hybrid_decode_step_op(sums: Tensor, log_max: Tensor, row_positions: Tensor,
                          position: Tensor, ring_k: Tensor, ring_v: Tensor, ring_keep: Tensor,
                          ring_sink: Tensor, sink_k: Tensor, sink_v: Tensor, sink_pos: Tensor,
                          q: Tensor, k: Tensor, v: Tensor, key_mask: Optional[Tensor],
                          w: Tensor, kernel: str, scale: Optional[float],
                          fit_a: Optional[Tensor], fit_basis: Optional[Tensor],
                          weights: Optional[Tensor], bias: Optional[Tensor],
                          lam: Optional[Tensor], decay: Optional[Tensor], window: int,
                          sinks: int, estimate: bool, step_kind: str) -> Tensor:
    """y [B, H, T, Dv] float32, the state (a HybridDecodeState's 11 tensors) advanced in
    place. step_kind as favor::decode_step's ('step': T = 1, one fused C++ call on the CPU;
    'prefill': causal hybrid attention over T tokens from the state; 'append_query',
    'append', 'query'); the map as favor::decode_step's; window, sinks the hybrid's sizes;
    estimate False: the window and the sinks alone (method='window', no linear state read or
    fed)."""
    return torch_hybrid(sums, log_max, row_positions, position, ring_k, ring_v, ring_keep,
                        ring_sink, sink_k, sink_v, sink_pos, q, k, v, key_mask, w, kernel,
                        scale, fit_a, fit_basis, weights, bias, lam, decay, window, sinks,
                        estimate, step_kind)


def torch_hybrid(*args):
    """The default kernel (plain torch operations)."""
    return _torch_kernel(args[:11], *args[11:])


@hybrid_decode_step_op.register_kernel("cpu")
def cpu_hybrid(*args):
    """The C++ HybridDecoder (map only) stepping the state's memory in place. The window and
    the sinks alone: the ring by torch operations, a prompt's attention (prefill on an empty
    state) by C++'s band kernel
    (favor::exact_attention's CPU kernel: nothing of the prompt's size beyond its output,
    where the torch band's blocks held 325 MiB at 8192 tokens on SmolLM2's layer)."""
    state, (q, k, v, key_mask, w, kernel, scale, fit_a, fit_basis, weights, bias, lam, decay,
            window, sinks, estimate, step_kind) = args[:11], args[11:]
    if not estimate:
        return _torch_kernel(state, *args[11:], prompt_backend="cpu")
    b, h, _, dv = v.shape
    dec = built_decoder(
        lambda: hybrid_decoder(b, h, dv, w, kernel, scale, fit_a, fit_basis, weights, bias, lam,
                               decay, window, sinks),
        ("hybrid", b, h, dv, kernel, scale, window, sinks),
        (w, fit_a, fit_basis, weights, bias, lam, decay))
    return cpu_step(dec, state, q, k, v, key_mask, step_kind)


def cpu_step(dec, state, q, k, v, key_mask, step_kind):
    """dec.step_state (a favor._core.HybridDecoder) on the memory of the state's tensors,
    advanced in place (a non-contiguous one through a contiguous copy, written back)."""
    T.follow_torch_threads()
    work = [t if t.is_contiguous() else t.contiguous() for t in state]
    keep = None if key_mask is None else T.array(key_mask.to(torch.bool))
    y = dec.step_state(tuple(t.numpy() for t in work), T.view(q.float()), T.view(k.float()),
                       T.view(v.float()), key_mask=keep, mode=step_kind)
    for t, x in zip(state, work):
        if t is not x:
            t.copy_(x)
    return T.tensor(y)


def triton_hybrid_step(state, q, k, v, cm, key_mask, scale, window, sinks, log_const, estimate):
    """favor::hybrid_decode_step for one token (q, k, v [B, H, 1, D or Dv]) by the fused
    push + query kernel on the HybridDecodeState's tensors, advanced in place: y [B, H, 1, Dv]."""
    from ..attention.triton_function import _f32
    from .triton import hybrid_decode_step  # imports triton: only when this path runs
    b, h = q.shape[:2]
    flat = lambda t: t.reshape(b * h, t.shape[-1]).contiguous()  # noqa: E731
    keep = None if key_mask is None else key_mask.to(q.device).ne(0).reshape(b)
    with torch.no_grad():
        y = hybrid_decode_step(
            state, flat(q), flat(k), flat(v), _f32(cm.W), _f32(cm.bias), _f32(cm.key_logw),
            _f32(cm.rate), float(cm.norm_coef), cm.kind, log_const, keep, h, scale=scale,
            window=window, sinks=sinks, estimate=estimate)
    return y.reshape(b, h, 1, -1)


def triton_hybrid(*args):
    """CUDA's kernel: one token ('step') by the fused Triton push + query kernel on the state
    in place (triton/decode.py: the position read on the device), else the default (torch
    operations), whose prompt on an empty state is favor::attention's Triton kernel (the
    band fused: triton/band.py)."""
    state, (q, k, v, key_mask, w, kernel, scale, fit_a, fit_basis, weights, bias, lam, decay,
            window, sinks, estimate, step_kind) = args[:11], args[11:]
    from ..attention.triton_function import supported
    if not _dispatch.triton_ready():
        return torch_hybrid(*args)
    fused = supported(q.shape[-1], v.shape[-1])
    if step_kind != "step" or q.shape[2] != 1 or not fused \
            or not all(t.is_contiguous() and t.device == q.device for t in state):
        # (the Triton forward takes any size with a window or sinks: its fused part, the band)
        return _torch_kernel(state, *args[11:], prompt_backend="triton"
                             if fused or window or sinks else "torch")
    check_step_inputs(q, k, v, key_mask, step_kind)
    cm = paths.device_map(q, w, weights, bias, lam, decay, fit_a, fit_basis, kernel, scale,
                          decay is not None)
    sc = q.shape[-1] ** -0.5 if scale is None else float(scale)
    log_const = pair_log_const(kernel, w.shape[0], fit_a) if estimate else 0.0
    return triton_hybrid_step(state, q.float(), k.float(), v.float(), cm, key_mask, sc,
                              int(window), int(sinks), log_const, bool(estimate))


hybrid_decode_step_op.register_kernel("cuda")(triton_hybrid)
_dispatch.register("hybrid_decode_step", {"cpu": cpu_hybrid, "torch": torch_hybrid,
                                          "triton": triton_hybrid})


@hybrid_decode_step_op.register_fake
def _(*args):
    q, v = args[11], args[13]
    return q.new_empty((*q.shape[:-1], v.shape[-1]), dtype=torch.float32)


def check_state(state, batch, heads, features, d, dv, window, sinks):
    """A HybridDecodeState's layout against the step's extents, by the C++ layout
    (favor._core.hybrid_state_layout): 11 tensors of its shapes and dtypes on one device."""
    if not isinstance(state, (tuple, list)) or len(state) != 11 or not all(
            isinstance(t, torch.Tensor) for t in state):
        raise _core.Error("state: must be a HybridDecodeState (11 tensors), as "
                          "empty_hybrid_state() makes it")
    layout = _core.hybrid_state_layout(batch, heads, features, d, dv, window, sinks)
    for t, (name, shape, dtype) in zip(state, layout):
        if list(t.shape) != list(shape) or t.dtype != getattr(torch, dtype):
            raise _core.Error(f"state.{name}: {t.dtype} {list(t.shape)} must be {dtype} "
                              f"{list(shape)}")
        if t.device != state[0].device:
            raise _core.Error(f"state.{name}: on device '{t.device}', state.sums on "
                              f"'{state[0].device}'; a state lives on one device")


def advance(state, q, k, v, projection, *, window, sinks, estimate=True, mode="step",
            kernel="positive", scale=None, fit=None, key_mask=None, weights=None, bias=None,
            feature_weights=None, decay=None, backend=None, decoder=None):
    """favor::hybrid_decode_step on a HybridDecodeState advanced in place; returns
    y [B, H, T, Dv] float32. mode and the map as favor.ops.decoder.advance's. decoder: the
    favor._core.HybridDecoder of this map, kept by an owner: eager CPU calls then run its
    kernel without the op's dispatch (the same kernel, the same bits)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (projection, "projection")):
        T.check_tensor(t, name)
    key_mask = _step_checks(q, k, v, key_mask, mode)
    forced = _dispatch.forced("hybrid_decode_step", backend, q)
    if decoder is not None and estimate and eager_mode() \
            and _dispatch.cpu_kernel_runs(backend, q, k, v, *state):
        return cpu_step(decoder, state, q, k, v, key_mask, mode)
    check_projection(projection, q)
    if not torch.compiler.is_compiling():
        features = _core.feature_count(kernel, projection.shape[0]) if estimate else 0
        check_state(state, q.shape[0], q.shape[1], features, q.shape[-1], v.shape[-1], window,
                    sinks)
        if state[0].device != q.device:
            raise _core.Error(f"state: on device '{state[0].device}', q on '{q.device}'; move "
                              "the state with .to(device)")
    args = (*tuple(state), q.float(), k.float(), v.float(),
            *op_map_args(q, key_mask, projection, kernel, scale, fit, weights, bias,
                         feature_weights, decay), int(window), int(sinks), bool(estimate), mode)
    with torch.no_grad():
        return (hybrid_decode_step_op if forced is None else forced)(*args)
