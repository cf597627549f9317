"""Activations (`reference/ops.md` §2.8): SwiGLU's gate, `silu_mul`.

    out = silu(gate) · up,   silu(g) = g · sigmoid(g) = g / (1 + exp(-g))

gate and up [rows, n] in T; the kernel computes in f32 and rounds to T once, at the store
(metaltile `mt_swiglu`: tol [1e-4, 5e-3, 5e-2] for f32/f16/bf16, the loosest a bound may be).

Kernel model (the tolerance, `oracle/numerics.py`): sigmoid = 1 / (1 + exp(-g)) (exp 2 ULP, the
add, the divide at 2 ULP), then g · sigmoid · up in the worst association (two roundings): it
covers g / (1 + exp(-g)) · up, one rounding fewer. Where exp(-g) leaves f32's range (g < -88)
the kernel's sigmoid underflows: the model charges a subnormal or flushed result its whole
magnitude. NaN/inf propagate as in IEEE: silu(+inf) = inf, silu(-inf) = -inf · 0 = NaN.
"""

from __future__ import annotations

from oracle.builders import elementwise_op, kernel_view, silu


def silu_mul(inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    return {"out": silu(v["gate"]) * v["up"]}


def silu_mul_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    gate, up, one = A.load(v["gate"]), A.load(v["up"]), A.load(1.0)
    return {"out": A.prod3(gate, one / (one + gate.neg().exp()), up)}


SEED_TOL = {"silu_mul": {"f32": 1e-4, "f16": 5e-3, "bf16": 5e-2}}

# gate and up come from one gate/up projection: its rewrite of gate stands for the op before
elementwise_op("silu_mul", "activations", ("gate", "up"), silu_mul, silu_mul_kernel,
               flops_per_elem=5, doc=__doc__, chain_input="gate")
