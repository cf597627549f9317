"""Logit soft-capping (Gemma 2; `softcap`): a smooth clamp of scores to (-c, c).

    out = c · tanh(x / c)            x [rows, n] in T; c = param `cap`, read as f32

Gemma 2 caps its final logits at c = 30 (rows: tokens, n: the vocabulary) and its attention
scores at c = 50 (`final_logit_softcapping`, `attn_logit_softcapping` in its config). The kernel
computes in f32 and rounds to T once, at the store.

Kernel model (the tolerance, `oracle/numerics.py`): x / c as a divide (2 ULP) or as x times an
f32 reciprocal of c (two roundings), whichever is worse; tanh, declared here (it is this op's own
function: `oracle/functions.py`), at its ULPs; the product by c (one rounding); the store. tanh
is increasing, so the divide's error maps through it exactly (its image's farther end).

tanh's ULPs at its result: CUDA's tanhf is within 2 (CUDA C Programming Guide, "Mathematical
Functions"); measured over 1.2M points (normal x 3, uniform on +-20, magnitudes 1e-40..10):
torch CPU 0.51, NumPy's f32 1.35, MLX CPU 0.32 2.08, charged 4 (`tests/test_softcap.py`
re-measures). Metal is held to MLX's until measured on an Apple GPU.

NaN propagates; x = +-inf gives +-c (tanh(+-inf) = +-1, IEEE), exactly as the oracle computes.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import elementwise_op, kernel_view
from oracle.functions import Function, register_function

register_function(Function("tanh", np.tanh, ulps=2.0, shape="increasing",
                           backend_ulps={"mlx": 4.0, "metal": 4.0}))

SEED_TOL = {"f32": 1e-4, "f16": 5e-3, "bf16": 5e-2}  # silu_mul's seed tolerances, the same class


def _cap(case) -> float:
    return float(np.float32(case.params["cap"]))


def softcap(inputs: dict, case) -> dict:
    c = _cap(case)
    return {"out": c * np.tanh(kernel_view(inputs, case)["x"] / c)}


def softcap_kernel(A, inputs: dict, case) -> dict:
    x, c, one = A.load(kernel_view(inputs, case)["x"]), A.load(_cap(case)), A.load(1.0)
    scaled = A.either(x / c, x * (one / c))
    return {"out": scaled.call("tanh") * c}


def cap_domain(case) -> None:
    """cap finite and > 0 in f32 (what the kernel reads): 0 divides by zero and inf makes
    x / c = 0 and c · 0 NaN; a negative cap is the same map as its magnitude (tanh is odd), a
    spelling no model's config uses."""
    with np.errstate(over="ignore"):
        c = float(np.float32(case.params["cap"]))
    if not (np.isfinite(c) and c > 0):
        raise ValueError(f"softcap: cap = {case.params['cap']} must be a finite number > 0 in "
                         f"f32 (Gemma 2: 30.0 for logits, 50.0 for attention scores)")


# x: the scores the op before it writes (the LM head's logits, an attention's QK^T)
elementwise_op("softcap", "softcap", ("x",), softcap, softcap_kernel, flops_per_elem=3,
               doc=__doc__, chain_input="x", params={"cap": 30.0}, inits={"x": "capped"},
               domain=cap_domain)
