"""MLX `softcap`: mlx-lm's Gemma 2 `mx.tanh(x / cap) * cap`, in f32, rounded to T once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _softcap(launch, inputs, outputs, case):
    import mlx.core as mx

    cap = mx.array(case.params["cap"], dtype=mx.float32)
    x = inputs["x"]
    return {"out": (mx.tanh(x.astype(mx.float32) / cap) * cap).astype(x.dtype)}


register(Impl("softcap", "mlx", "softcap", _softcap,
              doc="mx.tanh(x / cap) * cap in f32, rounded to T"))
