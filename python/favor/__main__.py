"""python3 -m favor: version, SIMD target, BLAS and threads of this build."""
from . import build_info, kernel_info

print(build_info())
print("kernel tiles:", ", ".join(f"{k} {v}" for k, v in kernel_info().items()))
