"""Quantized GEMV oracles over MLX's affine layout (`oracle/quant.py`; the seeds: metaltile-std
`src/ffai/dequant_gemv.rs`).

`dequant_gemv`: W [out, in] quantized in groups of G along `in` (bits per code, packed LSB-first
into uint32 words), scales and biases [out, in/G] in T, x [in] in T:

    out[r] = sum_d (q[r, d] * s[r, g(d)] + b[r, g(d)]) * x[d]            g(d) = d // G

in float64 from the stored codes, scales, biases and x (level 1: the kernel's contract, against
x @ dequantize(W); the loss against an unquantized W is not this op's business). One rounding to
T at the store.

Tolerance (derived): the admissible kernel model `gemv_kernel` run in the interval arithmetic of
`oracle/numerics.py`. The contract admits two forms, and the bound covers the worse of them:
  dequantize-then-dot   w = q*s + b (two roundings), t = w*x (one), out = sum_d t_d in the
                        impl's declared order (default: any order);
  the algebraic split   per group g: s_g * sum_{d in g} q_d x_d + b_g * sum_{d in g} x_d (the
                        products and the two group sums in f32, each rounding charged), then
                        the sum over groups in the declared order (the fast kernels, `qdot`).
An impl may declare which form it computes (`Numerics.form`) and the order of each sum
(`Numerics.sums`); the bound is then that form's alone. A third form exists for that:
  chunk_split           the split per 16-byte chunk of C = 128 / bits codes (a chunk lies in
                        one group): dot_c = sum q x ("chunk_dot"), xs_c = sum x ("chunk_x"),
                        and the row's sum over c of b_c xs_c and s_c dot_c ("row"), products
                        fused into FMAs where the declared order says so (cuda:kp_qgemv);
  dequantized_fma       w = fma(q, s, b) (one rounding), then the dot over `in` ("dot"), its
                        products fused where the declared order says so (cuda:kp_qmm);
  block_split           no biases: per group its dot ("block_dot"), then the sum of the scaled
                        group dots ("row") (cuda:kp_fp4_gemv, a group being an FP4 block).
Each rounding is charged half an f32 ULP at the largest magnitude its result can have (2^-150 in
the subnormal range, the magnitude itself under FTZ, param `ftz`, where f32-subnormal x also reads
as 0: `oracle.norms.kernel_view`), and the store the farther of T(y - e), T(y + e). An order an
impl declares (`Impl.numerics`: sequential, L lanes) replaces the any-order bound on the sums by
the partial sums that order forms: data-dependent and far tighter (a random-sign dot product's
partial sums grow as sqrt(k), not k).
NaN and inf inputs (the `nonfinite` distribution): the float64 oracle's IEEE propagation, except
that the split form may turn an oracle ±inf into NaN (inf - inf between s * sum(q x) and
b * sum(x)), so an output NaN where the oracle has ±inf passes (`OpSpec.inf_may_be_nan`); the
same holds for qmm and the fused rms_norm_qgemv, which allow the same split.
Against the seed (its `#[test_kernel]` tolerance, abs [5e-3, 5e-2, 2e-1] for f32/f16/bf16 at
outputs ~1; `docs/seed_kernels.md`): the bound relative to the output RMS stays under it on every
gate case (tests/test_gemv_oracle.py).
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import round_to, spacing
from oracle.numerics import product_into
from oracle.norms import kernel_view
from oracle.quant import dequantize, quantize_mlx, unpack
from oracle.spec import OpSpec, TensorSpec, register

EPS32 = dtype_eps("f32")
SEED_TOL = {"dequant_gemv": {"f32": 5e-3, "f16": 5e-2, "bf16": 2e-1}}


def _layout(case) -> tuple[int, int]:
    return case.dims["bits"], case.dims["group_size"]


def dequant_gemv(inputs: dict, case, w_hat: np.ndarray | None = None) -> dict:
    """out[r] = sum_d (q[r,d] s[r,g] + b[r,g]) x[d], float64; see the module docstring.
    `w_hat`: `dequantize` of these w, scales and biases, computed once by a caller that applies
    the same weights many times (the model gate's reference plan)."""
    if w_hat is None:
        bits, group = _layout(case)
        w_hat = dequantize(inputs["w"], inputs["scales"], inputs["biases"], bits, group)
    return {"out": w_hat @ kernel_view({"x": inputs["x"]}, case)["x"]}


def weights_kernel(A, inputs: dict, case):
    """(q, s, b) per code [out, in] as the kernel reads them (exact: codes and T values)."""
    bits, group = _layout(case)
    q = unpack(inputs["w"], bits, case.dims["in"]).astype(np.float64)
    s = np.repeat(np.asarray(inputs["scales"]).astype(np.float64), group, axis=-1)
    b = np.repeat(np.asarray(inputs["biases"]).astype(np.float64), group, axis=-1)
    return A.load(q), A.load(s), A.load(b)


CHUNK_TERMS = 1 << 16  # terms per block of output rows: the model's arrays stay in cache


def gemv_kernel_on(A, q, s, b, x, group: int):
    """out[..., r] = sum_d (q s + b)[r, d] x[..., d] for x [..., in] (a Val or Adverse, exact or
    carrying its own error): the worse of the two admissible forms (module docstring), computed
    over blocks of output rows (each row's terms are its own)."""
    rows = max(1, CHUNK_TERMS // int(np.prod(x.shape)))
    out = q.shape[0]
    if out <= rows:
        return _gemv_rows(A, q, s, b, x, group)
    blocks = [slice(r, min(r + rows, out)) for r in range(0, out, rows)]
    return A.concat([_gemv_rows(A, q.at(blk), s.at(blk), b.at(blk), x, group) for blk in blocks])


def _gemv_rows(A, q, s, b, x, group: int):
    if A.m.numerics.form == "chunk_split":
        return _chunk_split_rows(A, q, s, b, x)
    xr = x.reshape(*x.shape[:-1], 1, x.shape[-1])  # [..., 1, in] against W [out, in]
    if A.m.numerics.form == "dequantized_fma":  # w = fma(q, s, b): one rounding
        return A.sum(product_into(A, A.fused(q, s) + b, xr, "dot"), site="dot")
    if A.m.numerics.form == "block_split":
        return _block_split_rows(A, q, s, x, group)
    dequantized = A.sum((q * s + b) * xr)
    out, n = q.shape[0], q.shape[-1]
    g = n // group
    qx = A.sum((q * xr).reshape(*xr.shape[:-2], out, g, group))  # [..., out, groups]
    xs = A.sum(x.reshape(*x.shape[:-1], 1, g, group))  # [..., 1, groups]
    s_g = s.at((slice(None), slice(None, None, group)))
    b_g = b.at((slice(None), slice(None, None, group)))
    split = A.sum(s_g * qx + b_g * xs)
    return A.either(dequantized, split)


def _chunk_split_rows(A, q, s, b, x):
    """The form "chunk_split" (cuda:kp_qgemv): the split per 16-byte chunk of C = 128 / bits
    codes, each chunk's two terms added to the row's running sum in turn:

        dot_c = sum_{d in c} q_d x_d (sum "chunk_dot"),  xs_c = sum_{d in c} x_d ("chunk_x")
        out   = sum over c of [b_c * xs_c, s_c * dot_c] ("row", 2 terms a chunk)

    C is the terms of the declared "chunk_dot" order (a plan). A product is rounded unless the
    order of its sum fuses it (an FMA chain: `oracle.numerics.product_into`)."""
    out, n = q.shape[0], q.shape[-1]
    codes = A.m.numerics.order("chunk_dot").terms
    chunks = n // codes
    lead = x.shape[:-1]
    xc = x.reshape(*lead, 1, chunks, codes)
    dot = A.sum(product_into(A, q.reshape(out, chunks, codes), xc, "chunk_dot"),
                site="chunk_dot")  # [..., out, chunks]
    xs = A.sum(xc, site="chunk_x")  # [..., 1, chunks]
    first = (slice(None), slice(None, None, codes))
    bias_terms = product_into(A, b.at(first), xs, "row").reshape(*lead, out, chunks, 1)
    scale_terms = product_into(A, s.at(first), dot, "row").reshape(*lead, out, chunks, 1)
    terms = A.concat([bias_terms, scale_terms], axis=-1)
    return A.sum(terms.reshape(*lead, out, 2 * chunks), site="row")


def _block_split_rows(A, q, s, x, group: int):
    """The form "block_split" (no biases: cuda:kp_fp4_gemv): per group of codes its dot
    dot_g = sum q x (sum "block_dot"), then sum over g of s_g dot_g (sum "row"), products fused
    where the declared order says so."""
    out, n = q.shape[0], q.shape[-1]
    g = n // group
    dot = A.sum(product_into(A, q.reshape(out, g, group), x.reshape(*x.shape[:-1], 1, g, group),
                             "block_dot"), site="block_dot")  # [..., out, groups]
    s_g = s.at((slice(None), slice(None, None, group)))
    return A.sum(product_into(A, s_g, dot, "row"), site="row")


def gemv_kernel(A, inputs: dict, case) -> dict:
    """The admissible kernel of `dequant_gemv` (x [in]) and `qmm` (x [m, in])."""
    q, s, b = weights_kernel(A, inputs, case)
    x = A.load(kernel_view({"x": inputs["x"]}, case)["x"])
    return {"out": gemv_kernel_on(A, q, s, b, x, case.dims["group_size"])}


CLEAR_MARGIN_BIAS = 0.05  # added to each bias of the top row, toward its group's sum of x


def plant_logits(inputs: dict, case) -> dict:
    """The lm_head cases' planted structure (`cases/distributions.py`), on rows of W:

    * `near_tie`: row j = out/2 rows past the top row i becomes a copy of row i with its first
      bias moved by one ULP of T (random direction), so logits i and j differ by
      ulp(b) * sum_{d in group 0} x_d: within one output ULP. An impl may round both to one
      value and take the lower index: a near-tie, not a failure.
    * `clear_margin`: the top row's biases move by 0.05 toward the sign of their group's sum of
      x, raising its logit by 0.05 * sum_g |sum_{d in g} x_d|, far beyond any bound: the
      argmax must agree.
    * `quantized`: W itself (`unquantized_weights`) quantized by MLX's quantizer: codes,
      scales and biases as a real checkpoint's, so the level-2 loss is a real one.
    Other distributions: unchanged."""
    if case.dist == "quantized":
        w, scales, biases = quantize_mlx(unquantized_weights(case), case.dims["bits"],
                                         case.dims["group_size"], case.dtype)
        return {**inputs, "w": w, "scales": scales.astype(inputs["scales"].dtype),
                "biases": biases.astype(inputs["biases"].dtype)}
    if case.dist not in ("near_tie", "clear_margin"):
        return inputs
    inputs = {k: v.copy() for k, v in inputs.items()}
    w, scales, biases = inputs["w"], inputs["scales"], inputs["biases"]
    i = int(np.argmax(dequant_gemv(inputs, case)["out"]))
    b = biases.astype(np.float64)
    if case.dist == "near_tie":
        j = (i + case.dims["out"] // 2) % case.dims["out"]
        w[j], scales[j] = w[i], scales[i]
        step = spacing(b[i, 0], case.dtype) * (1 if int(w[i, 0]) % 2 else -1)
        b[j] = b[i]
        b[j, 0] += step
    else:
        group = case.dims["group_size"]
        x = np.asarray(inputs["x"]).astype(np.float64).reshape(-1, group).sum(axis=1)
        b[i] += CLEAR_MARGIN_BIAS * np.sign(x)
    inputs["biases"] = round_to(b, case.dtype).astype(biases.dtype)
    return inputs


def unquantized_weights(case) -> np.ndarray:
    """The W [out, in] (values of T) behind a `quantized` case: N(0, 0.02^2), typical of a
    trained projection, with 1 in 64 input columns 8x larger (the outlier channels that make
    group-wise quantization lossy). Deterministic from the case id."""
    rng = np.random.default_rng([int(case.id, 16), 2])
    out, n = case.dims["out"], case.dims["in"]
    w = 0.02 * rng.standard_normal((out, n))
    w[:, rng.choice(n, max(1, n // 64), replace=False)] *= 8.0
    return round_to(w, case.dtype)


def quantization_loss(inputs: dict, case) -> dict | None:
    """Level 2 (report-only): out against x @ W with the unquantized W, float64, for the
    `quantized` cases (None otherwise): what quantization costs, not what the kernel got wrong."""
    if case.dist != "quantized":
        return None
    w = unquantized_weights(case).astype(np.float64)
    return {"out": w @ np.asarray(inputs["x"]).astype(np.float64)}


W_WORDS = lambda d: (d["out"], d["in"] * d["bits"] // 32)  # noqa: E731
GROUPS = lambda d: (d["out"], d["in"] // d["group_size"])  # noqa: E731

register(OpSpec(
    name="dequant_gemv", family="quant_gemv", dims=("out", "in", "bits", "group_size"),
    inputs=(TensorSpec("w", W_WORDS, role="u32", init="codes"),
            TensorSpec("scales", GROUPS, init="qscale"),
            TensorSpec("biases", GROUPS, init="qbias"),
            TensorSpec("x", lambda d: (d["in"],), init="activation")),
    outputs=(TensorSpec("out", lambda d: (d["out"],), logits=True),),
    oracle=dequant_gemv, tolerance=None, kernel=gemv_kernel, version=2,
    bytes=lambda case: _io_bytes(case),
    flops=lambda case: 2 * case.dims["out"] * case.dims["in"],
    params={"ftz": 0}, doc=dequant_gemv.__doc__, plant=plant_logits, loss=quantization_loss,
    inf_may_be_nan=True, chain_input="x"))


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


def _expert_kernel(A, inputs: dict, case) -> dict:
    return gemv_kernel(A, expert_slab(inputs), case)


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
    oracle=dequant_gemv_expert_indexed, tolerance=None, kernel=_expert_kernel, version=2,
    bytes=_expert_bytes,
    flops=lambda case: 2 * case.dims["out"] * case.dims["in"],
    params={"expert": 0, "ftz": 0}, doc=dequant_gemv_expert_indexed.__doc__,
    inf_may_be_nan=True, chain_input="x"))
