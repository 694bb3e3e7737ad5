"""favor.torch's tensor helpers live with the ops (favor/ops/_tensors.py)."""
from ..ops._tensors import *  # noqa: F401,F403
from ..ops._tensors import FLOAT_TYPES, check_backend, check_device, check_tensor  # noqa: F401
