"""torch baseline for the fused RMSNorm + quantized GEMV: the norm in f32 as the contract says
(x * nw * rsqrt(mean(x^2) + eps), the normalised activation kept in f32), then the codes
dequantized in f32 and `F.linear` in f32, one rounding to T. What a user without a fused kernel
would run (two passes: the norm's output makes a round trip through memory)."""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract
from gpu_impls.impl import Impl
from gpu_impls.quant_layout import LAYOUT
from gpu_impls.torch.gemv import dequantize_f32


def normed_f32(x, norm_weight, eps: float):
    """x * nw * inv in f32, in the seed's order; inv = rsqrt(mean(x^2) + eps) over all of x."""
    import torch

    x = x.float()
    inv = torch.rsqrt(x.pow(2).mean() + eps)
    return x * norm_weight.float() * inv


def _norm_dequant_linear(launch, inputs, outputs, case):
    import torch.nn.functional as F

    x = inputs["x"]
    normed = normed_f32(x, inputs["norm_weight"], float(np.float32(case.params["eps"])))
    w_hat = dequantize_f32(inputs["w"], inputs["scales"], inputs["biases"], case)
    return {"out": F.linear(normed, w_hat).to(x.dtype)}


register(Impl("rms_norm_qgemv", "torch", "norm_dequant_linear", _norm_dequant_linear,
              Contract(invariants=LAYOUT),
              doc="x * nw * rsqrt(mean(x^2) + eps) in f32, then dequantize in f32 and F.linear "
                  "in f32, rounded to T"))
