"""Quantized GEMV oracles over MLX's affine layout (`oracle/quant.py`; `reference/ops.md` §2.3).

`dequant_gemv`: W [out, in] quantized in groups of G along `in` (bits per code, packed LSB-first
into uint32 words), scales and biases [out, in/G] in T, x [in] in T:

    out[r] = sum_d (q[r, d] * s[r, g(d)] + b[r, g(d)]) * x[d]            g(d) = d // G

in float64 from the stored codes, scales, biases and x (level 1: the kernel's contract, against
x @ dequantize(W); the loss against an unquantized W is not this op's business). One rounding to
T at the store.

Tolerance (derived). A kernel accumulates in f32 (u = eps32/2), either dequantize-then-dot or the
algebraic split s * sum(q x) + b * sum(x) per group (the fast kernels, `qdot`):
  (a) the store's rounding: half an ULP of T at |out|;
  (b) the f32 sum of `in` terms split over L >= 4 partial sums: (in/L + log2 L) u relative to
      the sum of the terms' magnitudes, plus k = 4 roundings per term (q*s, + b, * x, and the
      split's extra group product) with a 2x margin: eps32 * (in/8 + 1 + 4) * scale, where
      scale = sum_d (|q s| + |b|) |x_d| bounds both forms' terms, cancellation included.
Against the seed (`ops.md` §2.3: abs [5e-3, 5e-2, 2e-1] for f32/f16/bf16 at outputs ~1): at
in = 14336 with unit-order outputs, (b) is about 2.1e-4 * scale, so never looser.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import spacing
from oracle.quant import dequantize, unpack
from oracle.spec import OpSpec, TensorSpec, register

EPS32 = dtype_eps("f32")
SEED_TOL = {"dequant_gemv": {"f32": 5e-3, "f16": 5e-2, "bf16": 2e-1}}


def _layout(case) -> tuple[int, int]:
    return case.dims["bits"], case.dims["group_size"]


def dequant_gemv(inputs: dict, case) -> dict:
    """out[r] = sum_d (q[r,d] s[r,g] + b[r,g]) x[d], float64; see the module docstring."""
    bits, group = _layout(case)
    w_hat = dequantize(inputs["w"], inputs["scales"], inputs["biases"], bits, group)
    return {"out": w_hat @ np.asarray(inputs["x"]).astype(np.float64)}


def dequant_gemv_tolerance(inputs: dict, exact: dict, case) -> dict:
    bits, group = _layout(case)
    n = case.dims["in"]
    q = unpack(inputs["w"], bits, n).astype(np.float64)
    s = np.repeat(np.asarray(inputs["scales"]).astype(np.float64), group, axis=-1)
    b = np.repeat(np.asarray(inputs["biases"]).astype(np.float64), group, axis=-1)
    scale = (np.abs(q * s) + np.abs(b)) @ np.abs(np.asarray(inputs["x"]).astype(np.float64))
    y = exact["out"]
    return {"out": 0.5 * spacing(y, case.dtype) * (y != 0) + EPS32 * (n / 8 + 5) * scale}


W_WORDS = lambda d: (d["out"], d["in"] * d["bits"] // 32)  # noqa: E731
GROUPS = lambda d: (d["out"], d["in"] // d["group_size"])  # noqa: E731

register(OpSpec(
    name="dequant_gemv", family="quant_gemv", dims=("out", "in", "bits", "group_size"),
    inputs=(TensorSpec("w", W_WORDS, role="u32", init="codes"),
            TensorSpec("scales", GROUPS, init="qscale"),
            TensorSpec("biases", GROUPS, init="qbias"),
            TensorSpec("x", lambda d: (d["in"],), init="activation")),
    outputs=(TensorSpec("out", lambda d: (d["out"],)),),
    oracle=dequant_gemv, tolerance=dequant_gemv_tolerance,
    bytes=lambda case: _io_bytes(case),
    flops=lambda case: 2 * case.dims["out"] * case.dims["in"],
    params={}, doc=dequant_gemv.__doc__))


def _io_bytes(case) -> int:
    from oracle.spec import get_op

    return get_op("dequant_gemv").io_bytes(case)


# --- expert-indexed ------------------------------------------------------------------------------

def expert_slab(inputs: dict) -> dict:
    """The dequant_gemv inputs of the selected expert: slab `expert_index[0]` of w, scales and
    biases (the stacked [E, out, ...] arrays), and x."""
    e = int(np.asarray(inputs["expert_index"]).reshape(-1)[0])
    return {"w": inputs["w"][e], "scales": inputs["scales"][e], "biases": inputs["biases"][e],
            "x": inputs["x"]}


def dequant_gemv_expert_indexed(inputs: dict, case) -> dict:
    """`dequant_gemv` on expert e's slab of stacked weights (MoE decode, one expert):

        out[r] = sum_d (q[e, r, d] s[e, r, g] + b[e, r, g]) x[d],     e = expert_index[0]

    w [E, out, in * bits / 32] uint32, scales and biases [E, out, in / G] in T, expert_index a
    1-element uint32 device buffer (the case's param `expert`). Same rounding points, so the
    same bound as dequant_gemv on that slab; an impl must also equal its plain GEMV on the slab
    bit for bit when it says so (`Impl.exact_peer`)."""
    return dequant_gemv(expert_slab(inputs), case)


def _expert_tolerance(inputs: dict, exact: dict, case) -> dict:
    return dequant_gemv_tolerance(expert_slab(inputs), exact, case)


def _stacked(shape):
    return lambda d: (d["experts"], *shape(d))


def _expert_bytes(case) -> int:
    """One slab (not the E stacked ones: the kernel reads only the selected expert) + x, out and
    the 4-byte index."""
    return _io_bytes(case) + 4


register(OpSpec(
    name="dequant_gemv_expert_indexed", family="quant_gemv",
    dims=("experts", "out", "in", "bits", "group_size"),
    inputs=(TensorSpec("w", _stacked(W_WORDS), role="u32", init="codes"),
            TensorSpec("scales", _stacked(GROUPS), init="qscale"),
            TensorSpec("biases", _stacked(GROUPS), init="qbias"),
            TensorSpec("x", lambda d: (d["in"],), init="activation"),
            TensorSpec("expert_index", lambda d: (1,), role="u32", init="param:expert")),
    outputs=(TensorSpec("out", lambda d: (d["out"],)),),
    oracle=dequant_gemv_expert_indexed, tolerance=_expert_tolerance,
    bytes=_expert_bytes,
    flops=lambda case: 2 * case.dims["out"] * case.dims["in"],
    params={"expert": 0}, doc=dequant_gemv_expert_indexed.__doc__))
