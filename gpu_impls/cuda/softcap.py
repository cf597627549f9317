"""CUDA `softcap` (`kernels/softcap.cu`): one element per thread, cap * tanhf(x / cap) in f32,
one rounding to T at the store. Geometry: 256-thread blocks over rows * n elements."""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.cuda._module import cuda_impl, kernel, rows_by_n_geometry

KERNELS = [("softcap.cu", "softcap")]


def _make(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        args = (inputs["x"], outputs["out"], np.int64(launch.extra["count"]),
                np.float32(case.params["cap"]))
        kernel(*KERNELS[0], case.dtype, defines)(launch.grid, launch.block, args)
    return run


# No size invariant: every rows * n a buffer can hold is one 1-D grid (2^31 - 1 blocks of 256).
register(cuda_impl("softcap", "softcap", Contract(geometry=rows_by_n_geometry), _make,
                   "cap * tanhf(x / cap), one element per thread, f32 math, one rounding"))
