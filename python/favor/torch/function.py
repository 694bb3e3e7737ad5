"""favor.torch.attention lives with its op: favor/ops/attention."""
from ..ops.attention import attention, fit_tensors, projection_tensor  # noqa: F401
