"""What favor's torch ops share: the device switch, checks, and zero-copy conversion between
CPU tensors and the numpy views the C++ kernels read."""
import numpy as np
import torch

from .. import _core, _threads

FLOAT_TYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def backend(t, name):
    """The one device switch of favor's torch ops: 'cpu' for CPU tensors (the C++ kernels);
    any other device has no backend yet, and the error names the tensor and its device."""
    if t.device.type == "cpu":
        return "cpu"
    raise _core.Error(f"{name}: tensor on device '{t.device}'; favor has no kernels for "
                      f"'{t.device.type}' tensors yet (CPU only for now): move the tensors (and "
                      "the module) with .cpu()")


def check_tensor(t, name):
    """Raises favor.Error (a ValueError) for what favor's ops cannot take: non-tensors,
    tensors on a device without a backend, sparse or nested layouts, non-float dtypes."""
    if not isinstance(t, torch.Tensor):
        raise _core.Error(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    backend(t, name)
    if t.layout != torch.strided or getattr(t, "is_nested", False):
        raise _core.Error(f"{name}: layout {t.layout} is not supported; favor.torch takes dense "
                          "(strided) tensors")
    if t.dtype not in FLOAT_TYPES:
        raise _core.Error(f"{name}: dtype {t.dtype} is not a float type; favor.torch takes "
                          "float32 (used in place) or float64/float16/bfloat16 (computed in "
                          "float32)")


def as_float32(t, name):
    """t itself when float32 (autograd sees no op), else a differentiable cast."""
    check_tensor(t, name)
    return t if t.dtype == torch.float32 else t.to(torch.float32)


def view(t):
    """The numpy view of a float32 CPU tensor: no copy, strides kept."""
    return t.detach().numpy()


def tensor(a):
    """A torch tensor sharing the memory of a numpy array favor returned."""
    return torch.from_numpy(a)


def check_mask(m, name="key_padding_mask"):
    """The checks of a key_padding_mask that need no values (safe while tracing): a bool or
    float tensor on a device with a backend, or None."""
    if m is None:
        return None
    if not isinstance(m, torch.Tensor):
        raise _core.Error(f"{name}: expected a torch.Tensor, got {type(m).__name__}")
    backend(m, name)
    if m.dtype != torch.bool and not m.is_floating_point():
        raise _core.Error(f"{name}: dtype {m.dtype} must be bool (True = ignore) or float "
                          "(0 / -inf)")
    return m


def keep_mask(key_padding_mask, name="key_padding_mask"):
    """torch's key_padding_mask (bool True = ignore this key; or float, 0 = attend and
    -inf = ignore) as favor's key mask (nonzero = the key takes part), a numpy bool array.
    Reads the values: called inside the ops, where tensors hold data."""
    m = check_mask(key_padding_mask, name)
    if m is None:
        return None
    m = m.detach()
    if m.dtype == torch.bool:
        return (~m).numpy()
    ignore = torch.isneginf(m)
    if not bool(torch.all(ignore | (m == 0))):
        raise _core.Error(f"{name}: a float mask must hold only 0 (attend) and -inf "
                          "(ignore); favor cannot add other biases to the scores")
    return (~ignore).numpy()


def keep_tensor(key_padding_mask, name="key_padding_mask"):
    """keep_mask as a bool tensor computed by torch operations (safe while tracing, reads no
    values): True = the key takes part. A float mask's values (only 0 and -inf) are checked
    by the op that reads it (T.keep_mask)."""
    m = check_mask(key_padding_mask, name)
    if m is None:
        return None
    return ~m if m.dtype == torch.bool else ~torch.isneginf(m)


def array(t):
    """A C-contiguous numpy float array of an optional tensor (None stays None)."""
    return None if t is None else np.ascontiguousarray(t.detach().numpy())


def empty(dtype=torch.float32):
    """The placeholder an op returns for an output it did not compute (custom ops return
    tensors, never None)."""
    return torch.empty(0, dtype=dtype)


def follow_torch_threads():
    """favor uses torch.get_num_threads() threads unless favor.set_num_threads was called
    or FAVOR_NUM_THREADS is set: the two libraries then never oversubscribe the cores."""
    _threads.follow(torch.get_num_threads())


def projection_matrix(w, d):
    """A favor.Projection from a float [m, d] tensor (detached: gradients flow through the
    autograd function, not through this copy)."""
    check_tensor(w, "projection")
    if w.dim() != 2 or w.shape[1] != d:
        raise _core.Error(f"projection: tensor of shape {list(w.shape)} must be [m, {d}] (D = {d})")
    return _core.Projection.from_matrix(np.ascontiguousarray(view(w.to(torch.float32))))
