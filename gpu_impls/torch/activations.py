"""PyTorch baseline of `silu_mul`: `F.silu(gate) * up` in f32, rounded to T once (what a user
calls instead of a fused SwiGLU kernel)."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _silu_mul(launch, inputs, outputs, case):
    import torch.nn.functional as F

    gate, up = inputs["gate"], inputs["up"]
    return {"out": (F.silu(gate.float()) * up.float()).to(gate.dtype)}


register(Impl("silu_mul", "torch", "silu_mul", _silu_mul,
              doc="F.silu(gate.float()) * up.float(), rounded to T"))
