"""MLX gated group RMSNorm (`oracle/gated_norm.py`) composed from `mx` ops in f32, in both cast
conventions (param cast: "once", the weight multiplied in f32 and one rounding; "hf", the
normalised value rounded to T, then the weight product in T). mlx-lm's Nemotron-H norm calls
`mx.fast.rms_norm` on the gated value in the model's dtype: a third convention, not this one.
Batch invariant on a CPU, declared (verified over the gate cases and rows up to 64).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.impl import Impl


def _gated_group_rmsnorm(launch, inputs, outputs, case):
    import mlx.core as mx
    import mlx.nn as nn

    y, dtype, groups = inputs["y"], inputs["y"].dtype, case.dims["groups"]
    x = y.astype(mx.float32) * nn.silu(inputs["z"].astype(mx.float32))
    xg = x.reshape(*x.shape[:-1], groups, x.shape[-1] // groups)
    eps = float(np.float32(case.params["eps"]))
    x = (xg * mx.rsqrt(mx.mean(xg * xg, axis=-1, keepdims=True) + eps)).reshape(x.shape)
    if case.params["cast"] == "hf":
        return {"out": inputs["weight"] * x.astype(dtype)}
    return {"out": (x * inputs["weight"].astype(mx.float32)).astype(dtype)}


register(Impl("gated_group_rmsnorm", "mlx", "gated_group_rmsnorm", _gated_group_rmsnorm,
              batch_invariant=("cpu",),
              doc="composed f32: y * silu(z), rsqrt(mean(x^2) + eps) per group, both casts"))
