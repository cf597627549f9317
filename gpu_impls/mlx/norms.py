"""MLX impls of the RMSNorm family: `mx.fast.rms_norm` and composed MLX ops.

`mx.fast.rms_norm` rounds the normalised value to T before the weight multiply (the HF Llama
convention, `rounding="normed"`; measured on MLX 0.32 CPU: it matches that oracle bit for bit
except near rounding boundaries, and mismatches the one-rounding oracle in ~25% of bf16 elements).
The composed impls compute in f32 and round once.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, param_is
from gpu_impls.impl import Impl


def _eps(case) -> float:
    return float(np.float32(case.params["eps"]))


def _inv(x32, eps):
    import mlx.core as mx

    return mx.rsqrt(mx.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def _fast_rms_norm(launch, inputs, outputs, case):
    import mlx.core as mx

    return {"out": mx.fast.rms_norm(inputs["x"], inputs["w"], _eps(case))}


def _rms_norm_f32(launch, inputs, outputs, case):
    import mlx.core as mx

    x = inputs["x"].astype(mx.float32)
    w = inputs["w"].astype(mx.float32) + case.params["weight_offset"]
    return {"out": (x * _inv(x, _eps(case)) * w).astype(inputs["x"].dtype)}


def _rms_norm_residual(launch, inputs, outputs, case):
    import mlx.core as mx

    x = inputs["x"].astype(mx.float32)
    w = inputs["w"].astype(mx.float32) + case.params["weight_offset"]
    out = inputs["residual"].astype(mx.float32) + w * x * _inv(x, _eps(case))
    return {"out": out.astype(inputs["x"].dtype)}


def _add_rms_norm(launch, inputs, outputs, case):
    import mlx.core as mx

    t = inputs["a"].dtype
    s = inputs["a"].astype(mx.float32) + inputs["b"].astype(mx.float32)
    w = inputs["w"].astype(mx.float32) + case.params["weight_offset"]
    return {"residual_out": s.astype(t), "normed_out": (s * _inv(s, _eps(case)) * w).astype(t)}


def _gated_mixer_norm(launch, inputs, outputs, case):
    import mlx.core as mx

    y = inputs["y"]
    z = inputs["z"].astype(mx.float32)
    w = inputs["w"].astype(mx.float32) + case.params["weight_offset"]
    out = y * _inv(y, _eps(case)) * w * (z * mx.sigmoid(z))
    return {"out": out.astype(inputs["z"].dtype)}


def _rms_inv(launch, inputs, outputs, case):
    import mlx.core as mx

    return {"inv": _inv(inputs["x"].astype(mx.float32), _eps(case))[..., 0]}


# mx.fast.rms_norm takes the weight as stored: a Gemma (1 + w) weight would be formed in T.
_NORMED = Contract(invariants=(
    param_is("rounding", "normed", "mlx:rms_norm_f32 for rounding='once'", other="once"),
    param_is("weight_offset", 0, "mlx:rms_norm_f32 (forms 1 + w in f32)", other=1)))
_ONCE = Contract(invariants=(param_is("rounding", "once",
                                      "mlx:fast_rms_norm for rounding='normed'",
                                      other="normed"),))

register(
    Impl("rms_norm", "mlx", "fast_rms_norm", _fast_rms_norm, _NORMED, doc="mx.fast.rms_norm"),
    Impl("rms_norm", "mlx", "rms_norm_f32", _rms_norm_f32, _ONCE,
         doc="composed f32, one rounding"),
    Impl("rms_norm_per_head", "mlx", "fast_rms_norm_per_head", _fast_rms_norm, _NORMED,
         doc="mx.fast.rms_norm over head_dim"),
    Impl("rms_norm_residual", "mlx", "rms_norm_residual", _rms_norm_residual,
         doc="composed f32"),
    Impl("add_rms_norm", "mlx", "add_rms_norm", _add_rms_norm, doc="composed f32"),
    Impl("gated_mixer_norm", "mlx", "gated_mixer_norm", _gated_mixer_norm, doc="composed f32"),
    Impl("rms_inv", "mlx", "rms_inv", _rms_inv, doc="rsqrt(mean(x^2) + eps) in f32"),
)
