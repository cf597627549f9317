"""PyTorch gated group RMSNorm (`oracle/gated_norm.py`), in the two conventions users write:
param cast "once" is mamba_ssm's `rms_norm_ref` (group_size, norm_before_gate=False: the weight
multiplied in f32, one cast at the end); "hf" is HF's `Zamba2RMSNormGated` (the normalised
value cast to T, then `weight * x` in T). Both gate and normalise in f32. CUDA where torch sees a
GPU, else CPU. Not declared batch invariant: measured not to be on a CPU (F.silu's vector body
and scalar tail round differently; a row's place in the batch picks which).
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.impl import Impl


def gated_group_rmsnorm(y, z, weight, groups: int, eps: float, cast: str):
    """out [R, E] in y's dtype; y, z [R, E], weight [E]."""
    import torch
    import torch.nn.functional as F

    dtype = y.dtype
    x = y.float() * F.silu(z.float())
    xg = x.view(*x.shape[:-1], groups, x.shape[-1] // groups)
    xg = xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)
    x = xg.view(x.shape)
    if cast == "hf":
        return weight * x.to(dtype)
    return (x * weight.float()).to(dtype)


def _gated_group_rmsnorm(launch, inputs, outputs, case):
    eps = float(np.float32(case.params["eps"]))
    return {"out": gated_group_rmsnorm(inputs["y"], inputs["z"], inputs["weight"],
                                       case.dims["groups"], eps, case.params["cast"])}


register(Impl("gated_group_rmsnorm", "torch", "gated_group_rmsnorm", _gated_group_rmsnorm,
              doc="f32 y * silu(z), rsqrt(mean(x^2) + eps) per group; weight in f32 and one "
                  "cast (cast=once: mamba_ssm) or cast to T then weight (cast=hf: HF Zamba2)"))
