"""MLX `silu_mul`: `nn.silu`'s formula, gate * sigmoid(gate) * up, in f32, rounded to T once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _silu_mul(launch, inputs, outputs, case):
    import mlx.core as mx

    gate, up = inputs["gate"].astype(mx.float32), inputs["up"].astype(mx.float32)
    return {"out": (gate * mx.sigmoid(gate) * up).astype(inputs["gate"].dtype)}


register(Impl("silu_mul", "mlx", "silu_mul", _silu_mul,
              doc="gate * mx.sigmoid(gate) * up in f32, rounded to T"))
