"""`fp4_gemv`: x [M, K] (T, M = 1..4) against FP4 weights W [N, K] as `fp4_quantize` stores them
(`oracle/fp4.py`: codes [N, K/2] u8, scales [N, K/block] u8, tensor_scale [1] f32):

    y[i, n] = sum_k x[i, k] * w[n, k],     w[n, k] = e2m1(q[n, k]) * scale[n, k // block] * ts

float64 from the stored codes, scales and tensor scale (ts = 1 for mxfp4), f32 accumulation, one
rounding to T at the store.

Which dequantized weights are exact in f32:
    mxfp4   e2m1 (at most 2 significant bits, |v| <= 6) x 2^(e - 127), e <= 254: exact in f32
            down to 2^-149 (0.5 x 2^-127 = 2^-128 is an f32 subnormal, exact) and below f32's max
            for every scale `fp4_quantize` makes from a finite x (e - 127 <= 126 there; the byte
            254 with the code 6 would overflow: 6 x 2^127 > 2^128);
    nvfp4   e2m1 x UE4M3 (4 significant bits): at most 6 bits, exact in f32 (and >= 2^-10); times
            the f32 tensor scale ts (24 bits): up to 30 bits, NOT exact. That product is one f32
            rounding, and the kernel may also round ts x sf first (q x RN(sf ts), then round) or
            apply ts once to the f32 dot (ts x sum_b sf_b sum_k q x): the kernel model admits
            all three.

Tolerance (derived): the GEMV's kernel model (`oracle.gemv.gemv_kernel_on`, a K-term dot with
f32 products and an any-order sum, dequantize-then-dot or the per-block split) with the codes'
values as q, the block scale as s and no bias; for nvfp4 the worse of the tensor scale folded into
the block scale (sf x ts, one f32 rounding) and the tensor scale applied to the finished dot (one
more f32 product). M does not enter: rows of x never meet in a sum.
An impl may declare the form "block_split" (`Numerics.form`): each block's dot, then the sum of
the scaled block dots, then nvfp4's tensor scale (cuda:kp_fp4_gemv), with the order of each sum
("block_dot", "row") declared; the bound is then that form's alone.
"""

from __future__ import annotations

import numpy as np

from oracle.fp4 import (BLOCK, F32, PARAMS, PARAM_VALUES, dequantize, e2m1_values, fp4_domain,
                        fp4_quantize, plant, scale_values, unpack)
from oracle.gemv import gemv_kernel_on
from oracle.norms import kernel_view
from oracle.spec import OpSpec, TensorSpec, register


def fp4_gemv(inputs: dict, case) -> dict:
    """y = x @ dequant(W)^T, float64 (the dequantized weights are exact in float64)."""
    fmt = case.params["format"]
    w = dequantize(inputs["codes"], inputs["scales"], inputs["tensor_scale"], fmt)
    x = kernel_view({"x": inputs["x"]}, case)["x"]
    return {"y": np.asarray(x, dtype=np.float64) @ w.T}


def fp4_gemv_kernel(A, inputs: dict, case) -> dict:
    """The admissible kernel: the GEMV's over q = e2m1(codes), s = the block scale (module
    docstring); nvfp4's tensor scale folded into s or applied to the finished dot."""
    fmt = case.params["format"]
    block = BLOCK[fmt]
    q = A.load(e2m1_values(unpack(inputs["codes"])))
    sf = np.repeat(scale_values(inputs["scales"], fmt), block, axis=-1)
    zero = A.load(np.zeros_like(sf))
    x = A.load(kernel_view({"x": inputs["x"]}, case)["x"])
    ts = float(np.asarray(inputs["tensor_scale"], dtype=np.float64).reshape(-1)[0])
    if A.m.numerics.form == "block_split":  # `oracle.gemv`'s form; the tensor scale after
        y = gemv_kernel_on(A, q, A.load(sf), zero, x, block)
        return {"y": y if fmt == "mxfp4" else y * A.load(np.full((1, sf.shape[0]), ts))}
    if fmt == "mxfp4":  # ts = 1: s is exact
        return {"y": gemv_kernel_on(A, q, A.load(sf), zero, x, block)}
    folded = gemv_kernel_on(A, q, A.load(sf) * A.load(np.full_like(sf, ts)), zero, x, block)
    after = gemv_kernel_on(A, q, A.load(sf), zero, x, block) * A.load(np.full(
        (1, sf.shape[0]), ts))
    return {"y": A.either(folded, after)}


def _from_w(case, raw: dict) -> dict:
    """The weights as a checkpoint holds them: the drawn w (planted as fp4_quantize's x)
    quantized by the case's rule; x as drawn. A violating case (partial blocks, a rule of the
    other format: never launched) gets zero weights of the declared shapes."""
    d, p = case.dims, case.params
    if d["in"] % BLOCK[p["format"]] or case.spec.domain_error(case):
        return {"codes": np.zeros(CODES(d), np.uint8), "scales": np.zeros(SCALES(d, p), np.uint8),
                "tensor_scale": np.ones(1, F32), "x": raw["x"]}
    q = fp4_quantize(plant({"x": raw["w"]}, case), case)
    return {"codes": q["codes"].astype(np.uint8), "scales": q["scales"].astype(np.uint8),
            "tensor_scale": q["tensor_scale"].astype(F32), "x": raw["x"]}


W = lambda d: (d["out"], d["in"])  # noqa: E731
CODES = lambda d: (d["out"], d["in"] // 2)  # noqa: E731
X = lambda d: (d["m"], d["in"])  # noqa: E731


def SCALES(d, p) -> tuple[int, int]:  # noqa: N802
    return (d["out"], d["in"] // BLOCK[p["format"]])


register(OpSpec(
    name="fp4_gemv", family="fp4", dims=("m", "out", "in"),
    inputs=(TensorSpec("codes", CODES, role="u8", adversarial=False),
            TensorSpec("scales", SCALES, role="u8", adversarial=False),
            TensorSpec("tensor_scale", lambda d: (1,), role="f32", adversarial=False),
            TensorSpec("x", X, init="activation")),
    outputs=(TensorSpec("y", lambda d: (d["m"], d["out"])),),
    oracle=fp4_gemv, tolerance=None, kernel=fp4_gemv_kernel,
    bytes=lambda case: case.spec.io_bytes(case),
    flops=lambda case: 2 * case.dims["m"] * case.dims["out"] * case.dims["in"],
    params=PARAMS, param_values=PARAM_VALUES, domain=fp4_domain, version=1,
    make_inputs=_from_w, raw_inputs=(TensorSpec("w", W), TensorSpec("x", X, init="activation")),
    doc=__doc__, inf_may_be_nan=True, chain_input="x"))
