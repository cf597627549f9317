"""Fused RMSNorm + quantized GEMV (the seed: metaltile-std `src/ffai/rms_norm_qgemv.rs`; layout
`oracle/quant.py`): one decode token's input norm feeding a quantized projection.

`rms_norm_qgemv`: x [in] and norm_weight [in] in T, W [out, in] in MLX's affine layout
(`oracle/quant.py`: codes packed LSB-first in uint32 words, scales and biases [out, in/G] in T):

    inv     = rsqrt(sum_d x_d^2 / in + eps)                  over the whole x; eps read as f32
    n_d     = x_d * nw_d * inv                               the seed's order, kept in f32
    out[r]  = sum_d (q[r,d] * s[r,g(d)] + b[r,g(d)]) * n_d   g(d) = d // G

Rounding points (from the seed's three kernels): x and norm_weight are widened to f32; the
normalised activation n_d is *not* rounded to T (it never leaves registers: the point of the
fusion), unlike the HF-Llama / `mx.fast.rms_norm` convention T(x * inv) * w. The one rounding
to T is the store. So the oracle computes in float64 from the T-rounded inputs (as the kernel
sees them: with `ftz`, f32-subnormal inputs read as 0, `oracle.norms.kernel_view`) and returns
the pre-store value. No weight offset: the seed multiplies by norm_weight as stored.

Tolerance (derived): the admissible kernel model, in the interval arithmetic of
`oracle/numerics.py`: the norm's `inv` as `oracle.norms.inv_kernel` (the sum of squares in the
impl's declared order, the divide, + eps, rsqrt at 2 ULP), n_d = x_d * nw_d * inv in the worst
association (two roundings, carried into every term), then the GEMV on n_d as
`oracle.gemv.gemv_kernel_on` (the worse of dequantize-then-dot and the algebraic split), and the
store. An all-zero x gives out = 0 and a bound of exactly 0 (every term is an exact zero).
Domain: as rms_norm's (`oracle.norms.eps_domain`): eps = 0 with `tiny` x in f32 / bf16, where
every x² underflows and a correct kernel's rsqrt(0) is inf, is refused.
Against the seed: its test_kernel tolerance is 2e-1 absolute at outputs of order 10 for every
dtype (2e-2 relative), its legacy test a max relative error of 5e-3 / 2e-2 / 5e-2 for f32 / f16 /
bf16; the loosest acceptable bound relative to the output is the tighter of the two
(`SEED_REL_TOL`); `tests/test_rms_qgemv_oracle.py` checks it on every gate case.
"""

from __future__ import annotations

import numpy as np

from oracle.gemv import GROUPS, W_WORDS, gemv_kernel_on, weights_kernel
from oracle.norms import eps_domain, inv_kernel, kernel_view, rms_inv_rows
from oracle.quant import dequantize
from oracle.spec import OpSpec, TensorSpec, get_op, register

# The seed's tolerances as a fraction of the output's magnitude: min(2e-1 abs at O(10), legacy
# max-rel 5e-3 / 2e-2 / 5e-2).
SEED_REL_TOL = {"f32": 5e-3, "f16": 2e-2, "bf16": 2e-2}


def normed_activation(inputs: dict, case) -> tuple[np.ndarray, float]:
    """(n_d = x_d * nw_d * inv, inv) in float64, from the inputs as the kernel sees them."""
    v = kernel_view({"x": inputs["x"], "nw": inputs["norm_weight"]}, case)
    inv = float(rms_inv_rows(v["x"], float(np.float32(case.params["eps"])))[0])
    return v["x"] * v["nw"] * inv, inv


def _w_hat(inputs: dict, case, scales=None, biases=None) -> np.ndarray:
    d = case.dims
    return dequantize(inputs["w"], inputs["scales"] if scales is None else scales,
                      inputs["biases"] if biases is None else biases, d["bits"], d["group_size"])


def rms_norm_qgemv(inputs: dict, case) -> dict:
    """out[r] = sum_d (q s + b)[r, d] * x_d * nw_d * rsqrt(mean(x^2) + eps), float64; see the
    module docstring."""
    normed, _ = normed_activation(inputs, case)
    return {"out": _w_hat(inputs, case) @ normed}


def rms_norm_qgemv_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view({"x": inputs["x"], "nw": inputs["norm_weight"]}, case)
    x, nw = A.load(v["x"]), A.load(v["nw"])
    normed = A.prod3(x, nw, A.keep(inv_kernel(A, x, case)))
    q, s, b = weights_kernel(A, inputs, case)
    return {"out": gemv_kernel_on(A, q, s, b, normed, case.dims["group_size"])}


def _bytes(case) -> int:
    return get_op("rms_norm_qgemv").io_bytes(case)


IN = lambda d: (d["in"],)  # noqa: E731

register(OpSpec(
    name="rms_norm_qgemv", family="quant_gemv", dims=("out", "in", "bits", "group_size"),
    inputs=(TensorSpec("w", W_WORDS, role="u32", init="codes"),
            TensorSpec("scales", GROUPS, init="qscale"),
            TensorSpec("biases", GROUPS, init="qbias"),
            TensorSpec("x", IN),
            TensorSpec("norm_weight", IN, init="weight")),
    outputs=(TensorSpec("out", lambda d: (d["out"],)),),
    oracle=rms_norm_qgemv, tolerance=None, kernel=rms_norm_qgemv_kernel, version=2, bytes=_bytes,
    # the GEMV's multiply-add per weight, plus the norm's square-add and two multiplies per x
    flops=lambda case: 2 * case.dims["out"] * case.dims["in"] + 4 * case.dims["in"],
    params={"eps": 1e-6, "ftz": 0}, doc=rms_norm_qgemv.__doc__, inf_may_be_nan=True,
    chain_input="x", domain=eps_domain("x")))
