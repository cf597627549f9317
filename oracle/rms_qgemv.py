"""Fused RMSNorm + quantized GEMV (`reference/ops.md` §2.0, §2.2; the seed
`metaltile-std_rms_norm_qgemv.rs`): one decode token's input norm feeding a quantized projection.

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

Tolerance (derived). A kernel computes in f32 (u = eps32/2):
  (a) the store's rounding: half an ULP of T at |out|;
  (b) the GEMV over n, as `dequant_gemv` (`oracle/gemv.py`): eps32 * (in/8 + 1 + 4) * scale,
      with scale = sum_d (|q s| + |b|) |n_d|, which bounds the terms of both the dequantize-
      then-dot form and the algebraic split s * sum(q n) + b * sum(n) (cancellation included);
  (c) the norm: inv's relative error (the sum of `in` squares over L >= 4 partial sums, / in,
      + eps, rsqrt at 2 ULP) and the two multiplies forming n_d; inv is common to every term,
      so its error scales the whole sum: `oracle.norms.f32_noise(in, k=8) * scale` (k: rsqrt
      2 ULP, the divide, the add and two multiplies at 1/2 ULP each = 4 ULP, 2x margin);
  (d) subnormal f32 intermediates (the `tiny` distribution): each rounding in the subnormal
      range errs by up to 2^-150 absolute (2^-126 under FTZ), amplified by what multiplies it
      later: x*nw by inv and then |w_hat|, n_d by |w_hat|, and the q*s, +b, *n, +acc roundings
      by at most |n_d| or 1: amplify = sum_d ((inv + 1)(|q s| + |b|) + 2 |n_d| + 2).
An all-zero x gives out = 0 and a bound of exactly 0 (every term is an exact zero).

Against the seed: its test_kernel tolerance is 2e-1 absolute at outputs of order 10 for every
dtype (2e-2 relative), its legacy test a max relative error of 5e-3 / 2e-2 / 5e-2 for f32 / f16 /
bf16; the loosest acceptable bound relative to the output is the tighter of the two
(`SEED_REL_TOL`). At in = 14336 (b)+(c) are ~2.2e-4 * scale, and (a) is 2^-9 relative for bf16,
so never looser; `tests/test_rms_qgemv_oracle.py` checks it on every gate case.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import spacing
from oracle.gemv import GROUPS, W_WORDS
from oracle.norms import f32_noise, kernel_view, rms_inv_rows, subnormal_err
from oracle.quant import dequantize
from oracle.spec import OpSpec, TensorSpec, get_op, register

EPS32 = dtype_eps("f32")
NORM_K = 8  # ULPs of the norm's f32 steps, 2x margin: see (c) in the module docstring
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


def rms_norm_qgemv_tolerance(inputs: dict, exact: dict, case) -> dict:
    n = case.dims["in"]
    normed, inv = normed_activation(inputs, case)
    # |q s| + |b| per weight: q >= 0, so it is the dequantization with |s| and |b|
    w_abs = _w_hat(inputs, case, np.abs(inputs["scales"]), np.abs(inputs["biases"]))
    scale = w_abs @ np.abs(normed)
    amplify = (inv + 1.0) * w_abs.sum(axis=-1) + 2.0 * np.abs(normed).sum() + 2.0 * n
    y = exact["out"]
    return {"out": 0.5 * spacing(y, case.dtype) * (y != 0)
            + (EPS32 * (n / 8 + 5) + f32_noise(n, NORM_K)) * scale
            + subnormal_err(case) * amplify * (scale != 0)}


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
    oracle=rms_norm_qgemv, tolerance=rms_norm_qgemv_tolerance, bytes=_bytes,
    # the GEMV's multiply-add per weight, plus the norm's square-add and two multiplies per x
    flops=lambda case: 2 * case.dims["out"] * case.dims["in"] + 4 * case.dims["in"],
    params={"eps": 1e-6, "ftz": 0}, doc=rms_norm_qgemv.__doc__, inf_may_be_nan=True))
