"""PyTorch baselines: `silu_mul` as `F.silu(gate) * up` in f32, rounded to T once (what a user
calls instead of a fused SwiGLU kernel), and as HF's LlamaMLP runs it in T (`silu_mul_hf`: silu
rounded to T, then the product: rounding "act"); `clipped_swiglu` as HF's GptOssExperts writes it
(clamp, gate * sigmoid(gate * alpha), (up + 1) * glu), in f32, rounded to T once."""

from __future__ import annotations

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.impl import Impl


def _silu_mul(launch, inputs, outputs, case):
    import torch.nn.functional as F

    gate, up = inputs["gate"], inputs["up"]
    return {"out": (F.silu(gate.float()) * up.float()).to(gate.dtype)}


def _silu_mul_hf(launch, inputs, outputs, case):
    import torch.nn.functional as F

    return {"out": F.silu(inputs["gate"]) * inputs["up"]}


ONCE = param_is("rounding", "once", "torch:silu_mul_hf for rounding='act'", other="act")
register(Impl("silu_mul", "torch", "silu_mul", _silu_mul, Contract(invariants=(ONCE,)),
              doc="F.silu(gate.float()) * up.float(), rounded to T"),
         Impl("silu_mul", "torch", "silu_mul_hf", _silu_mul_hf,
              Contract(invariants=(param_is("rounding", "act",
                                            "torch:silu_mul for rounding='once'", other="once"),)),
              doc="HF LlamaMLP's act_fn(gate) * up in T: F.silu(gate) rounded to T, then the "
                  "product"))


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
