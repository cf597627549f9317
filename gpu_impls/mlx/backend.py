"""MLX: the default device (Metal GPU on Apple silicon, CUDA with mlx-cuda, else CPU).

MLX arrays are immutable, so MLX impls return fresh outputs (nothing to poison).
"""

from __future__ import annotations

import numpy as np

from gpu_impls.backend import Backend
from oracle.dtypes import storage_dtype


class MlxBackend(Backend):
    name = "mlx"
    writes_in_place = False

    def available(self):
        try:
            import mlx.core as mx
        except ImportError as e:
            return False, f"mlx not installed ({e}); pip install 'kparity[mlx-cpu]' or '[mlx-cuda]'"
        return True, f"mlx {mx.__version__} on {self.device()}"

    def device(self) -> str:
        import mlx.core as mx

        dev = mx.default_device()
        if dev.type == mx.cpu:
            return "cpu"
        backend = "metal" if mx.metal.is_available() else "cuda"
        return f"{backend}:gpu"

    def versions(self):
        import mlx.core as mx

        return {"mlx": mx.__version__}

    def to_device(self, array: np.ndarray):
        import mlx.core as mx

        if array.dtype == storage_dtype("bf16"):
            return mx.array(np.ascontiguousarray(array).view(np.uint16)).view(mx.bfloat16)
        return mx.array(array)

    def to_host(self, array, dtype: str) -> np.ndarray:
        import mlx.core as mx

        mx.eval(array)
        if array.dtype == mx.bfloat16:
            return np.array(array.view(mx.uint16)).view(storage_dtype("bf16"))
        return np.array(array).astype(storage_dtype(dtype), copy=False)

    def synchronize(self):
        import mlx.core as mx

        mx.synchronize()

    def timer(self):
        from gpu_impls.mlx._timer import TIMER

        return TIMER


BACKEND = MlxBackend()
