"""PyTorch baselines for the RMSNorm family: what a user would call instead of a custom kernel.

`torch:rms_norm` is `F.rms_norm` itself (fused: one rounding at the store; with a Gemma weight
offset the weight `1 + w` is formed in f32 first, since forming it in T would add a rounding);
`torch:rms_norm_llama` is the HF Llama formulation `w * (x·r).to(T)`. The rest are composed from
f32 ops with one rounding at the end, as the kernel contracts specify.

Baselines return fresh tensors, as a user's call does (copying into the runner's buffer would
add a pass over the output to every timing). The `*_compiled` impls are `torch.compile` of the
same functions (static shapes: one compile per case shape; Inductor fuses each into one Triton
kernel on a GPU); they need a CUDA device and Triton, and run only there.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gpu_impls import register
from gpu_impls.contract import Contract, param_is, rounding_once
from gpu_impls.impl import Impl


def eps_f32(case) -> float:
    return float(np.float32(case.params["eps"]))


def _inv(x32, eps):
    import torch

    return torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm_fn(x, w, eps: float, offset: float):
    import torch.nn.functional as F

    if offset:
        return F.rms_norm(x.float(), (x.shape[-1],), w.float() + offset, eps).to(x.dtype)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def residual_fn(x, residual, w, eps: float, offset: float):
    x = x.float()
    return (residual.float() + (w.float() + offset) * x * _inv(x, eps)).to(residual.dtype)


def add_fn(a, b, w, eps: float, offset: float):
    s = a.float() + b.float()
    return s.to(a.dtype), (s * _inv(s, eps) * (w.float() + offset)).to(a.dtype)


def _rms_norm(launch, inputs, outputs, case, fn=rms_norm_fn):
    return {"out": fn(inputs["x"], inputs["w"], eps_f32(case), case.params["weight_offset"])}


def _rms_norm_residual(launch, inputs, outputs, case, fn=residual_fn):
    return {"out": fn(inputs["x"], inputs["residual"], inputs["w"], eps_f32(case),
                      case.params["weight_offset"])}


def _add_rms_norm(launch, inputs, outputs, case, fn=add_fn):
    s, normed = fn(inputs["a"], inputs["b"], inputs["w"], eps_f32(case),
                   case.params["weight_offset"])
    return {"residual_out": s, "normed_out": normed}


COMPILED_GATE_CASES = 9  # compiling once per shape costs seconds: see Impl.gate_cases_max


def needs_gpu_and_triton() -> tuple[bool, str]:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return False, "torch.compile baselines run on CUDA only (no GPU here)"
    if importlib.util.find_spec("triton") is None:
        return False, "torch.compile needs triton (not installed)"
    return True, ""


def _compiled(run, fn):
    """`run` with `fn` replaced by torch.compile(fn): static shapes, compiled once per shape."""
    state = {}

    def compiled_run(launch, inputs, outputs, case):
        if "fn" not in state:
            import torch

            torch._dynamo.config.cache_size_limit = 1024  # one entry per case shape and dtype
            state["fn"] = torch.compile(fn, dynamic=False)
        return run(launch, inputs, outputs, case, fn=state["fn"])
    return compiled_run


def _rms_norm_llama(launch, inputs, outputs, case):
    x, w = inputs["x"], inputs["w"]
    normed = (x.float() * _inv(x.float(), eps_f32(case))).to(x.dtype)
    weight = w + case.params["weight_offset"] if case.params["weight_offset"] else w
    outputs["out"].copy_(weight * normed)


def _gated_mixer_norm(launch, inputs, outputs, case):
    import torch.nn.functional as F

    y = inputs["y"].float()
    w = inputs["w"].float() + case.params["weight_offset"]
    outputs["out"].copy_(y * _inv(y, eps_f32(case)) * w * F.silu(inputs["z"].float()))


def _rms_inv(launch, inputs, outputs, case):
    outputs["inv"].copy_(_inv(inputs["x"].float(), eps_f32(case))[..., 0])


_ONCE = Contract(invariants=rounding_once("torch:rms_norm_llama for rounding='normed'"))

RMS_NORM = Impl("rms_norm", "torch", "rms_norm", _rms_norm, _ONCE,
                doc="torch.nn.functional.rms_norm")
PER_HEAD = Impl("rms_norm_per_head", "torch", "rms_norm_per_head", _rms_norm,
                Contract(invariants=rounding_once(
                    "mlx:fast_rms_norm_per_head for rounding='normed'")),
                doc="F.rms_norm over head_dim (Qwen3 q_norm/k_norm)")
RESIDUAL = Impl("rms_norm_residual", "torch", "rms_norm_residual", _rms_norm_residual,
                doc="composed f32: residual + w * x * rsqrt(mean(x^2) + eps)")
ADD = Impl("add_rms_norm", "torch", "add_rms_norm", _add_rms_norm,
           doc="composed f32: s = a + b; (s, s * rsqrt(mean(s^2) + eps) * w)")


def compiled_twin(eager: Impl, fn) -> Impl:
    """`torch:<name>_compiled`: the eager impl with `fn` run through torch.compile."""
    return dataclasses.replace(eager, name=f"{eager.name}_compiled",
                               run=_compiled(eager.run, fn),
                               doc=f"torch.compile of {eager.id} ({eager.doc}), static shapes",
                               requires=needs_gpu_and_triton,
                               gate_cases_max=COMPILED_GATE_CASES)


register(
    RMS_NORM, PER_HEAD, RESIDUAL, ADD,
    Impl("rms_norm", "torch", "rms_norm_llama", _rms_norm_llama,
         Contract(invariants=(param_is("rounding", "normed",
                                       "torch:rms_norm for rounding='once'", other="once"),)),
         doc="HF LlamaRMSNorm: w * (x.float() * rsqrt(mean(x^2) + eps)).to(T)"),
    Impl("gated_mixer_norm", "torch", "gated_mixer_norm", _gated_mixer_norm,
         doc="composed f32: y * rsqrt(mean(y^2) + eps) * w * silu(z)"),
    Impl("rms_inv", "torch", "rms_inv", _rms_inv, doc="rsqrt(mean(x^2) + eps) in f32"),
    compiled_twin(RMS_NORM, rms_norm_fn), compiled_twin(PER_HEAD, rms_norm_fn),
    compiled_twin(RESIDUAL, residual_fn), compiled_twin(ADD, add_fn),
)
