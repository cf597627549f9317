"""MLX `silu_mul`: `nn.silu`'s formula, gate * sigmoid(gate) * up, in f32, rounded to T once;
`clipped_swiglu`: mlx-lm's GPT-OSS `swiglu` (mx.minimum / mx.clip, gate * sigmoid(alpha gate)
* (up + 1)) in f32, rounded to T once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.impl import Impl


def _silu_mul(launch, inputs, outputs, case):
    import mlx.core as mx

    gate, up = inputs["gate"].astype(mx.float32), inputs["up"].astype(mx.float32)
    return {"out": (gate * mx.sigmoid(gate) * up).astype(inputs["gate"].dtype)}


register(Impl("silu_mul", "mlx", "silu_mul", _silu_mul,
              Contract(invariants=(param_is("rounding", "once",
                                            "torch:silu_mul_hf for rounding='act'",
                                            other="act"),)),
              doc="gate * mx.sigmoid(gate) * up in f32, rounded to T"))


def _clipped_swiglu(launch, inputs, outputs, case):
    import mlx.core as mx

    p = case.params
    limit = p["limit"]
    gate, up = inputs["gate"].astype(mx.float32), inputs["up"].astype(mx.float32)
    gate = mx.minimum(gate, limit) if p["gate_clamp"] == "max" else mx.clip(gate, -limit, limit)
    up = mx.clip(up, -limit, limit)
    out = gate * mx.sigmoid(p["alpha"] * gate) * (up + 1)
    return {"out": out.astype(inputs["gate"].dtype)}


register(Impl("clipped_swiglu", "mlx", "clipped_swiglu", _clipped_swiglu,
              doc="min(gate, limit) * sigmoid(alpha gate) * (clip(up) + 1) in f32, rounded to T"))
