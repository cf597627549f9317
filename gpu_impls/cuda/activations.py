"""CUDA `silu_mul` (`kernels/silu_mul.cu`) and `clipped_swiglu` (`kernels/clipped_swiglu.cu`, both
gate clamps, "max" and "both"): one element per thread, f32 inside, one rounding to T at the
store. Geometry: 256-thread blocks over rows * n elements."""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.cuda._module import cuda_impl, kernel, rows_by_n_geometry

KERNELS = [("silu_mul.cu", "silu_mul"), ("clipped_swiglu.cu", "clipped_swiglu")]


# No size invariant: every rows * n a buffer can hold is one 1-D grid (2^31 - 1 blocks of 256).
CONTRACT = Contract(geometry=rows_by_n_geometry)
# silu_mul's kernel rounds once, at the store
SILU_CONTRACT = Contract(invariants=(param_is("rounding", "once",
                                              "torch:silu_mul_hf for rounding='act'",
                                              other="act"),), geometry=rows_by_n_geometry)


def _make(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        args = (inputs["gate"], inputs["up"], outputs["out"], np.int64(launch.extra["count"]))
        kernel(*KERNELS[0], case.dtype, defines)(launch.grid, launch.block, args)
    return run


def _make_clipped(defines: tuple = ()):
    def run(launch, inputs, outputs, case):
        p = case.params
        args = (inputs["gate"], inputs["up"], outputs["out"], np.int64(launch.extra["count"]),
                np.float32(p["limit"]), np.float32(p["alpha"]),
                np.int32(p["gate_clamp"] == "both"))
        kernel(*KERNELS[1], case.dtype, defines)(launch.grid, launch.block, args)
    return run


register(cuda_impl("silu_mul", "silu_mul", SILU_CONTRACT, _make,
                   "silu(gate) * up, one element per thread, f32 math, one rounding at the store"),
         cuda_impl("clipped_swiglu", "clipped_swiglu", CONTRACT, _make_clipped,
                   "GPT-OSS: g * sigmoid(alpha g) * (clip(up, +-limit) + 1), gate clamped above "
                   "(or both sides), NaN kept by the clamps; f32 math, one rounding"))
