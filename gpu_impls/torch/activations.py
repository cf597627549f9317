"""PyTorch baselines: `silu_mul` as `F.silu(gate) * up` in f32, rounded to T once (what a user
calls instead of a fused SwiGLU kernel); `clipped_swiglu` as HF's GptOssExperts writes it
(clamp, gate * sigmoid(gate * alpha), (up + 1) * glu), in f32, rounded to T once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.impl import Impl


def _silu_mul(launch, inputs, outputs, case):
    import torch.nn.functional as F

    gate, up = inputs["gate"], inputs["up"]
    return {"out": (F.silu(gate.float()) * up.float()).to(gate.dtype)}


register(Impl("silu_mul", "torch", "silu_mul", _silu_mul,
              doc="F.silu(gate.float()) * up.float(), rounded to T"))


def _clipped_swiglu(launch, inputs, outputs, case):
    import torch

    p = case.params
    limit, alpha = p["limit"], float(torch.tensor(p["alpha"], dtype=torch.float32))
    gate, up = inputs["gate"].float(), inputs["up"].float()
    gate = gate.clamp(max=limit) if p["gate_clamp"] == "max" else gate.clamp(-limit, limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return {"out": ((up + 1) * glu).to(inputs["gate"].dtype)}


register(Impl("clipped_swiglu", "torch", "clipped_swiglu", _clipped_swiglu,
              doc="HF GPT-OSS: (up.clamp(+-limit) + 1) * g * sigmoid(alpha g), f32, rounded to T"))
