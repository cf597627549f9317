"""Metal: MSL kernels dispatched through `mx.fast.metal_kernel`, on macOS with an Apple GPU only."""

from __future__ import annotations

import platform

from gpu_impls.mlx.backend import MlxBackend


class MetalBackend(MlxBackend):
    name = "metal"

    def available(self):
        if platform.system() != "Darwin":
            return False, f"Metal needs macOS with an Apple GPU (this is {platform.system()})"
        ok, why = super().available()
        if not ok:
            return ok, why
        import mlx.core as mx

        if not mx.metal.is_available():
            return False, "mlx reports no Metal device"
        return True, f"mlx {mx.__version__} Metal"


BACKEND = MetalBackend()
