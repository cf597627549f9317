"""PyTorch baselines for the RMSNorm family: what a user would call instead of a custom kernel.

`torch:rms_norm` is `F.rms_norm` itself (fused: one rounding at the store; with a Gemma weight
offset the weight `1 + w` is formed in f32 first, since forming it in T would add a rounding);
`torch:rms_norm_llama` is the HF Llama formulation `w * (x·r).to(T)`. The rest are composed from
f32 ops with one rounding at the end, as the kernel contracts specify.
"""

from __future__ import annotations

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, param_is, rounding_once
from gpu_impls.impl import Impl


def _eps(case) -> float:
    return float(np.float32(case.params["eps"]))


def _inv(x32, eps):
    import torch

    return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def _rms_norm(launch, inputs, outputs, case):
    import torch.nn.functional as F

    x, w = inputs["x"], inputs["w"]
    offset = case.params["weight_offset"]
    if offset:
        y = F.rms_norm(x.float(), (x.shape[-1],), w.float() + offset, _eps(case))
    else:
        y = F.rms_norm(x, (x.shape[-1],), w, _eps(case))
    outputs["out"].copy_(y)


def _rms_norm_llama(launch, inputs, outputs, case):
    x, w = inputs["x"], inputs["w"]
    normed = (x.float() * _inv(x.float(), _eps(case))).to(x.dtype)
    weight = w + case.params["weight_offset"] if case.params["weight_offset"] else w
    outputs["out"].copy_(weight * normed)


def _rms_norm_residual(launch, inputs, outputs, case):
    x = inputs["x"].float()
    w = inputs["w"].float() + case.params["weight_offset"]
    outputs["out"].copy_(inputs["residual"].float() + w * x * _inv(x, _eps(case)))


def _add_rms_norm(launch, inputs, outputs, case):
    s = inputs["a"].float() + inputs["b"].float()
    w = inputs["w"].float() + case.params["weight_offset"]
    outputs["residual_out"].copy_(s)
    outputs["normed_out"].copy_(s * _inv(s, _eps(case)) * w)


def _gated_mixer_norm(launch, inputs, outputs, case):
    import torch.nn.functional as F

    y = inputs["y"].float()
    w = inputs["w"].float() + case.params["weight_offset"]
    outputs["out"].copy_(y * _inv(y, _eps(case)) * w * F.silu(inputs["z"].float()))


def _rms_inv(launch, inputs, outputs, case):
    outputs["inv"].copy_(_inv(inputs["x"].float(), _eps(case))[..., 0])


_ONCE = Contract(invariants=rounding_once("torch:rms_norm_llama for rounding='normed'"))

register(
    Impl("rms_norm", "torch", "rms_norm", _rms_norm, _ONCE,
         doc="torch.nn.functional.rms_norm"),
    Impl("rms_norm", "torch", "rms_norm_llama", _rms_norm_llama,
         Contract(invariants=(param_is("rounding", "normed",
                                       "torch:rms_norm for rounding='once'"),)),
         doc="HF LlamaRMSNorm: w * (x.float() * rsqrt(mean(x^2) + eps)).to(T)"),
    Impl("rms_norm_per_head", "torch", "rms_norm_per_head", _rms_norm,
         Contract(invariants=rounding_once("mlx:fast_rms_norm_per_head for rounding='normed'")),
         doc="F.rms_norm over head_dim (Qwen3 q_norm/k_norm)"),
    Impl("rms_norm_residual", "torch", "rms_norm_residual", _rms_norm_residual,
         doc="composed f32: residual + w * x * rsqrt(mean(x^2) + eps)"),
    Impl("add_rms_norm", "torch", "add_rms_norm", _add_rms_norm,
         doc="composed f32: s = a + b; (s, s * rsqrt(mean(s^2) + eps) * w)"),
    Impl("gated_mixer_norm", "torch", "gated_mixer_norm", _gated_mixer_norm,
         doc="composed f32: y * rsqrt(mean(y^2) + eps) * w * silu(z)"),
    Impl("rms_inv", "torch", "rms_inv", _rms_inv, doc="rsqrt(mean(x^2) + eps) in f32"),
)
