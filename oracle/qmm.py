"""Quantized matmul over M activation rows (metaltile-std's mt_qmm family, `src/mlx/quantized.rs`,
in its "qmm_t" form; layout `oracle/quant.py`).

`qmm`: W [out, in] quantized in groups of G along `in` (codes packed LSB-first into uint32
words), scales and biases [out, in/G] in T, x [m, in] in T, m = 1..32 (decode batches,
speculative drafts, small prefills):

    out[i, r] = sum_d (q[r, d] * s[r, g(d)] + b[r, g(d)]) * x[i, d]       g(d) = d // G

in float64 from the stored codes, scales, biases and x; one rounding to T at the store. Each
row i is `dequant_gemv` (oracle/gemv.py) on x[i]: the oracle and the tolerance are that op's,
applied to the M columns of x^T at once, so the two ops cannot drift apart.

Tolerance (derived): out[i, r] is one dot of `in` terms, accumulated in f32 exactly as a GEMV
row is (dequantize-then-dot or the algebraic split, in the impl's declared order), so the kernel
model is dequant_gemv's (`oracle.gemv.gemv_kernel`) with x's M rows as a leading axis. M does not enter:
rows never meet in a sum, and a kernel that reads the weight once for all M rows still sums each
(i, r) over `in` terms only. Against the seed (mt_qmm's test tolerance
[5e-3, 5e-2, 2e-1] abs for f32/f16/bf16 at O(1) outputs, the same as dequant_gemv's), the bound
relative to the output RMS stays below it on every gate case (tests/test_qmm.py).

Batch: `m` is a batch dim (`OpSpec.batch`): x and out carry it as their leading axis, W, scales
and biases are shared. An impl declaring `batch_invariant` must give row i of an M-row product
the bits of the 1-row product on x[i] alone.
"""

from __future__ import annotations

import numpy as np

from oracle.gemv import GROUPS, SEED_TOL, W_WORDS, dequant_gemv, gemv_kernel
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

# mt_qmm's test_kernel tolerance (`src/mlx/quantized.rs`) is dequant_gemv's [5e-3, 5e-2, 2e-1].
SEED_TOL_QMM = SEED_TOL["dequant_gemv"]


def _columns(inputs: dict) -> dict:
    """The dequant_gemv inputs whose x holds the M activation rows as columns: [in, m]."""
    return {**inputs, "x": np.asarray(inputs["x"]).T}


def qmm(inputs: dict, case, w_hat: np.ndarray | None = None) -> dict:
    """out[i, r] = sum_d (q[r,d] s[r,g] + b[r,g]) x[i,d], float64: W_hat @ x^T, transposed.
    `w_hat`: as dequant_gemv's (the model gate's reference prefill applies every matrix)."""
    return {"out": dequant_gemv(_columns(inputs), case, w_hat)["out"].T}


register(OpSpec(
    name="qmm", family="quant_gemv", dims=("m", "out", "in", "bits", "group_size"),
    inputs=(TensorSpec("w", W_WORDS, role="u32", init="codes"),
            TensorSpec("scales", GROUPS, init="qscale"),
            TensorSpec("biases", GROUPS, init="qbias"),
            TensorSpec("x", lambda d: (d["m"], d["in"]), init="activation")),
    outputs=(TensorSpec("out", lambda d: (d["m"], d["out"])),),
    oracle=qmm, tolerance=None, kernel=gemv_kernel, version=2,
    bytes=lambda case: case.spec.io_bytes(case),  # the weight once for all M rows
    flops=lambda case: 2 * case.dims["m"] * case.dims["out"] * case.dims["in"],
    params={"ftz": 0}, doc=__doc__, batch=BatchDim("m", inputs=("x",), outputs=("out",)),
    inf_may_be_nan=True, chain_input="x"))
