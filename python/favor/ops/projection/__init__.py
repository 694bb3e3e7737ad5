"""favor::projection: the drawn projection W [m, d] of (kind, m, d, norms, seed) as a torch op,
so that a compiled or exported model draws it inside the graph (the C++ draw, cached)."""
from .op import projection, projection_op

__all__ = ["projection", "projection_op"]
