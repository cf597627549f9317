"""Activations (seeds: metaltile-std `src/mlx/swiglu.rs`, `src/mlx/fused_gate_activation.rs`):
SwiGLU's gate, `silu_mul`, and GPT-OSS's clipped SwiGLU, `clipped_swiglu`.

    out = silu(gate) · up,   silu(g) = g · sigmoid(g) = g / (1 + exp(-g))

gate and up [rows, n] in T; the kernel computes in f32 and rounds to T once, at the store
(metaltile `mt_swiglu`: tol [1e-4, 5e-3, 5e-2] for f32/f16/bf16, the loosest a bound may be).
Param `rounding` names the contract's rounding points (a convention: `OpSpec.conventions`):
  "once" out = T(silu(gate) · up): one rounding at the store (fused kernels, metaltile);
  "act"  out = T(T(silu(gate)) · up): silu rounded to T before the product (HF's LlamaMLP
         `act_fn(gate) * up` in T, Liger's `LigerSiLUMulFunction`).
A kernel that skips the intermediate rounding (or adds one) is off by up to one ULP of T where
silu(gate) is not within its own f32 noise of a midpoint of T, and fails there.

Kernel model (the tolerance, `oracle/numerics.py`): sigmoid = 1 / (1 + exp(-g)) (exp 2 ULP, the
add, the divide at 2 ULP), then g · sigmoid · up in the worst association (two roundings): it
covers g / (1 + exp(-g)) · up, one rounding fewer. Where exp(-g) leaves f32's range (g < -88)
the kernel's sigmoid underflows: the model charges a subnormal or flushed result its whole
magnitude. NaN/inf propagate as in IEEE: silu(+inf) = inf, silu(-inf) = -inf · 0 = NaN.

`clipped_swiglu` (GPT-OSS's MLP, HF `GptOssExperts`; metaltile `mt_fused_gate_clipped_swiglu`,
tol [1e-3, 1e-2, 5e-2]):

    g = min(gate, limit)          (`gate_clamp="both"`: clip(gate, -limit, limit), metaltile's)
    u = clip(up, -limit, limit)
    out = (u + 1) · g · sigmoid(alpha · g)          limit 7.0, alpha 1.702, both read as f32

The clamps are exact; the kernel model charges alpha · g (one rounding), the sigmoid as
silu_mul's, u + 1 (one rounding) and the three-factor product in the worst association. NaN
propagates through the clamps (torch.clamp, mx.minimum and np.minimum all keep it); ±inf in up
and +inf in gate clamp to ±limit; -inf in gate is -inf · 0 = NaN under the "max" clamp.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import elementwise_op, kernel_view, sigmoid, silu
from oracle.dtypes import round_to


def silu_mul(inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    act = silu(v["gate"])
    if case.params["rounding"] == "act":  # the declared rounding point
        act = round_to(act, case.dtype).astype(np.float64)
    return {"out": act * v["up"]}


def silu_mul_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    gate, up, one = A.load(v["gate"]), A.load(v["up"]), A.load(1.0)
    sig = one / (one + gate.neg().exp())
    if case.params["rounding"] == "act":
        return {"out": (gate * sig).round_to(case.dtype) * up}
    return {"out": A.prod3(gate, sig, up)}


def _clamped(inputs: dict, case) -> tuple[np.ndarray, np.ndarray, float]:
    """(g, u, alpha): the clamped gate and up as the kernel reads them, alpha as f32."""
    v = kernel_view(inputs, case)
    p = case.params
    limit = float(np.float32(p["limit"]))
    gate = v["gate"]
    g = np.minimum(gate, limit) if p["gate_clamp"] == "max" else np.clip(gate, -limit, limit)
    return g, np.clip(v["up"], -limit, limit), float(np.float32(p["alpha"]))


def clipped_swiglu(inputs: dict, case) -> dict:
    g, u, alpha = _clamped(inputs, case)
    return {"out": (u + 1.0) * g * sigmoid(alpha * g)}


def clipped_swiglu_kernel(A, inputs: dict, case) -> dict:
    g, u, alpha = _clamped(inputs, case)
    gate, up, one = A.load(g), A.load(u), A.load(1.0)
    sig = one / (one + (gate * A.load(alpha)).neg().exp())
    return {"out": A.prod3(gate, sig, up + one)}


SEED_TOL = {"silu_mul": {"f32": 1e-4, "f16": 5e-3, "bf16": 5e-2},
            "clipped_swiglu": {"f32": 1e-3, "f16": 1e-2, "bf16": 5e-2}}

# gate and up come from one gate/up projection: its rewrite of gate stands for the op before
elementwise_op("silu_mul", "activations", ("gate", "up"), silu_mul, silu_mul_kernel,
               flops_per_elem=5, doc=__doc__, chain_input="gate", params={"rounding": "once"},
               param_values={"rounding": ("once", "act")}, conventions=("rounding",))

def clamp_domain(case) -> None:
    """limit > 0 and finite, alpha finite, each as f32 (what the kernel reads): a limit <= 0
    inverts clip's bounds (numpy and torch then return the upper bound everywhere, HF's
    GPT-OSS code never meets it), inf or NaN leaves the clamp undefined or void."""
    with np.errstate(over="ignore"):  # a value past f32's range reads as inf: refused below
        limit, alpha = (float(np.float32(case.params[k])) for k in ("limit", "alpha"))
    if not (np.isfinite(limit) and limit > 0):
        raise ValueError(f"{case.op}: limit = {case.params['limit']} must be a finite number "
                         f"> 0 in f32 (the clamp's bound; GPT-OSS uses 7.0)")
    if not np.isfinite(alpha):
        raise ValueError(f"{case.op}: alpha = {case.params['alpha']} must be finite in f32 "
                         f"(the sigmoid's slope; GPT-OSS uses 1.702)")


# gate and up straddle the clamps: the case's distribution times limit / 2 (`cases/activations`)
elementwise_op("clipped_swiglu", "activations", ("gate", "up"), clipped_swiglu,
               clipped_swiglu_kernel, flops_per_elem=9, doc=__doc__, chain_input="gate",
               params={"limit": 7.0, "alpha": 1.702, "gate_clamp": "max"},
               param_values={"gate_clamp": ("max", "both")},
               inits={"gate": "clipped", "up": "clipped"}, domain=clamp_domain)
