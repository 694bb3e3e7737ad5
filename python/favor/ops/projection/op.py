"""favor::projection: W [m, d] float32 drawn by the C++ library from (kind, m, d, norms, seed)
alone (the same bits as the CLI's --projection/--features/--norms/--seed)."""
import functools

import torch
from torch import Tensor

from ... import _args, _core

_U64 = 1 << 64


@functools.lru_cache(maxsize=64)
def _drawn(kind, m, d, norms, seed):
    """The drawn matrix, once per (kind, m, d, norms, seed): favor.make_projection checks the
    options and names the argument in its errors."""
    w = _args.make_projection(d, kind, features=m, norms=norms, seed=seed)
    return torch.from_numpy(w.matrix.copy())


@torch.library.custom_op("favor::projection", mutates_args=(), device_types=None)
def projection_op(kind: str, m: int, d: int, norms: str, seed: int) -> Tensor:
    """W [m, d] (a new tensor each call; the draw itself is cached). seed is the uint64 seed
    in two's complement (the schema's int is int64)."""
    return _drawn(kind, m, d, norms, seed + _U64 if seed < 0 else seed).clone()


@projection_op.register_fake
def _(kind, m, d, norms, seed):
    return torch.empty(m, d, dtype=torch.float32)


def projection(kind, m, d, norms="chi", seed=0):
    """The drawn projection as a float32 tensor [m, d] (favor.make_projection's matrix).
    Errors are favor.Error naming the argument (features for m)."""
    m = _args.check_features(m)
    s = _args.check_seed(seed)
    if not isinstance(kind, str):
        raise _core.Error("projection: must be a kind (iid, orthogonal, radial, qmc, sorf, "
                              f"simplex, dct) or a favor.Projection, not {type(kind).__name__}")
    if not isinstance(norms, str):
        raise _core.Error(f"norms: {norms!r} must be a string (chi, fixed or quantile)")
    return projection_op(kind, m, int(d), norms, s - _U64 if s >= _U64 // 2 else s)
