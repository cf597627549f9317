"""RMSNorm family oracles (`reference/ops.md` §2.1, `math.md` §8).

Common math, per row r of length n (the last axis):

    inv_r = rsqrt(sum_i x_ri^2 / n + eps)          eps read as float32 (the kernels' eps_buf)
    out_ri = x_ri * inv_r * (w_i + weight_offset)  weight_offset 0 (Llama/Qwen) or 1 (Gemma)

Rounding points: inputs are stored in T (f32, f16 or bf16); the kernels load them, compute in
f32, and round to T once, at the store. So the oracle computes in float64 from the T-rounded
inputs and returns the pre-store value; the one rounding to T is applied on the way out. The
HF-Llama convention `w * T(x * inv)` (two roundings) is a different contract, not this one.

Tolerance (derived, not tuned). A correct kernel differs from the exact pre-store value y* by
  (a) the store's rounding to T: at most half an ULP of T at |y*|, and
  (b) its f32 arithmetic before the store (u = eps32/2 = 2^-24, one rounding):
      - the sum of n positive squares, split over L >= 4 partial sums (SIMD lanes on a CPU,
        threads then a tree on a GPU), has relative error <= (n/L + log2 L)·u; a sequential
        sum of equal terms (constant rows) does come close to this, so it is a worst case,
        not a random walk. rsqrt halves it: eps32·(n/16 + 0.5).
      - rsqrt itself: 2 ULP (CUDA `rsqrtf`); each multiply or add: half an ULP. `k` counts
        these in ULPs, with a 2x margin.
      - an f32 intermediate in the subnormal range (tiny inputs) carries an absolute error of
        up to 2^-150, amplified by the later factors (inv and the weight): `amplify`.
Subnormals: with param `ftz=1` (a backend that flushes f32 subnormals to zero, e.g. every CuPy
kernel, compiled with -ftz=true; Metal's fast math likewise) the oracle reads every input as the
kernel does after widening to f32, subnormals as 0, and an intermediate may flush too: its
absolute error is then up to the smallest f32 normal, 2^-126, instead of 2^-150.
So the element-wise bound is `half_ulp_T(y*) + eps32·(n/16 + 0.5 + k)·scale + 2^-150·amplify`,
with `scale` the magnitude the f32 errors are relative to (|y*|, or |residual| + |normed| when a
residual is added, since the sum can cancel). For T = f16/bf16 the half-ULP term dominates (the
kernel lands one ULP away only when y* sits within f32 noise of a rounding boundary); for T = f32
term (b) does. All-zero rows give bound 0: out must be exactly 0.

NaN and inf inputs (the `nonfinite` distribution): IEEE propagation through the formula above
is the contract. A row holding a NaN is NaN throughout. A row holding ±inf (no NaN) has
sum x^2 = inf, so inv = rsqrt(inf) = 0: its finite elements give exactly ±0 and the infinite
one inf·0 = NaN. With a residual (s = x + r) the same holds for s, and inf - inf = NaN. The
check requires NaN exactly where the oracle has NaN, the same infinity where it has one, and
within-bound values elsewhere (`runners/metrics.py`): a kernel that clamps, skips or zeroes
non-finite values fails.

Against the seeds (`ops.md` §2.1, absolute tolerances for outputs of magnitude ~1: mt_rms_norm
f32 1e-4 / f16 2e-2 / bf16 1e-1, per-head 1e-4 / 5e-3 / 5e-2): at |y*| ~ 1 the derived bounds are
about 6.3e-5 (f32, n = 8192), 4.9e-4 (f16) and 3.9e-3 (bf16), so never looser. `tests/test_norms_oracle`
checks this over every gate case.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import eps as dtype_eps
from oracle.dtypes import round_to, rounding_margin, spacing
from oracle.spec import OpSpec, TensorSpec, register

EPS32 = dtype_eps("f32")
# The seeds' own test tolerances (absolute, outputs ~1): the loosest a bound may ever be.
# mt_add_rms_norm's legacy 1e-3 (one value for every dtype, checked against MLX's own kernel on
# the same GPU) is below one ULP of f16/bf16 at 1.0, which no rounded output can meet against an
# exact oracle; for f16/bf16 it takes the bounds of its TPG = n/4 siblings. gated_mixer_norm
# takes ffai_gated_rmsnorm's (identical math); rms_inv has none and takes mt_rms_norm's f32 bound.
SEED_TOL = {
    "rms_norm": {"f32": 1e-4, "f16": 2e-2, "bf16": 1e-1},
    "rms_norm_per_head": {"f32": 1e-4, "f16": 5e-3, "bf16": 5e-2},
    "rms_norm_residual": {"f32": 1e-4, "f16": 2e-2, "bf16": 1e-1},
    "add_rms_norm": {"f32": 1e-3, "f16": 2e-2, "bf16": 1e-1},
    "gated_mixer_norm": {"f32": 1e-4, "f16": 2e-2, "bf16": 8e-2},
    "rms_inv": {"f32": 1e-4, "f16": 1e-4, "bf16": 1e-4},
}


TINY32 = float(np.finfo(np.float32).tiny)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def kernel_view(inputs: dict, case) -> dict:
    """Inputs as float64, as the kernel sees them after widening to f32: with `ftz`, values in
    the f32 subnormal range read as zero."""
    out = {k: _f64(v) for k, v in inputs.items()}
    if case.params.get("ftz"):
        out = {k: np.where(np.abs(v) < TINY32, 0.0, v) for k, v in out.items()}
    return out


def _eps(case) -> float:
    return float(np.float32(case.params["eps"]))


def rms_inv_rows(x: np.ndarray, eps: float) -> np.ndarray:
    """rsqrt(mean(x^2) + eps) along the last axis, keepdims, float64."""
    x = _f64(x)
    return 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


SUBNORMAL_ERR32 = 2.0 ** -150  # absolute rounding error of an f32 result in the subnormal range


def f32_noise(n: int, k: float) -> float:
    """Relative error bound of the f32 arithmetic before the store (see the module docstring)."""
    return EPS32 * (n / 16.0 + 0.5 + k)


def store_bound(exact: np.ndarray, dtype: str, scale: np.ndarray, n: int, k: float,
                amplify: np.ndarray | float = 0.0) -> np.ndarray:
    """half an ULP of `dtype` at |exact| + f32 noise relative to `scale` + subnormal slack.
    Where `scale` is 0 (an all-zero row: every term of the computation is an exact zero) the
    bound is exactly 0."""
    return (0.5 * spacing(exact, dtype) * (exact != 0) + f32_noise(n, k) * np.abs(scale)
            + SUBNORMAL_ERR32 * amplify * (scale != 0))


def subnormal_err(case) -> float:
    """Absolute error of one f32 rounding in the subnormal range: 2^-150, or the smallest normal
    2^-126 where the kernel flushes subnormals (param `ftz`)."""
    return TINY32 if case.params.get("ftz") else SUBNORMAL_ERR32


def _amplify(inputs: dict, case, data: str = "x") -> np.ndarray:
    """inv_r · (1 + |w|): how much a subnormal f32 intermediate's error can grow by the store."""
    inv = rms_inv_rows(kernel_view(inputs, case)[data], _eps(case))
    scale = subnormal_err(case) / SUBNORMAL_ERR32
    return scale * inv * (1.0 + np.abs(_f64(inputs["w"]) + case.params["weight_offset"]))


def _row_op(name: str, oracle, tolerance, inputs, outputs, flops_per_elem: int, doc: str,
            dims=("rows", "n"), params=None) -> OpSpec:
    def elems(case) -> int:
        return int(np.prod([case.dims[d] for d in dims]))

    return register(OpSpec(
        name=name, family="norms", dims=dims, inputs=inputs, outputs=outputs,
        oracle=oracle, tolerance=tolerance,
        bytes=lambda case: get_bytes(name, case),
        flops=lambda case: flops_per_elem * elems(case),
        params=params or {"eps": 1e-6, "weight_offset": 0, "ftz": 0}, doc=doc))


def get_bytes(name: str, case) -> int:
    from oracle.spec import get_op

    return get_op(name).io_bytes(case)


ROWS = lambda d: (d["rows"], d["n"])  # noqa: E731
ROW_N = lambda d: (d["n"],)  # noqa: E731


# --- rms_norm ---------------------------------------------------------------------------------

def rms_norm(inputs: dict, case) -> dict:
    """out = x · rsqrt(mean(x²) + eps) · (w + weight_offset); x [rows, n] T, w [n] T, out T.

    Param `rounding` names the contract's rounding points:
      "once"   out = T(x·inv·w): one rounding at the store (metaltile kernels, Gemma,
               torch's fused `F.rms_norm`);
      "normed" out = T(w · T(x·inv)): the normalised value is rounded to T before the weight
               multiply (HF Llama/Qwen `w * (x·r).to(dtype)`, `mx.fast.rms_norm`).
    """
    v = kernel_view(inputs, case)
    x, w = v["x"], v["w"]
    normed = x * rms_inv_rows(x, _eps(case))
    w = w + case.params["weight_offset"]
    if case.params["rounding"] == "normed":
        rounded = round_to(normed, case.dtype).astype(np.float64)
        return {"out": rounded * w, "_normed": normed, "_w": w}
    return {"out": normed * w}


def rms_norm_tolerance(inputs: dict, exact: dict, case) -> dict:
    """k = 6: rsqrt (2 ULP), two multiplies, w + offset, with a 2x margin -> 2*(2+1).

    With rounding="normed" the kernel's own rounding of x·inv to T may land on the other
    neighbour, but only where the exact x·inv lies within the f32 noise of a rounding boundary
    of T; there the bound grows by one ULP of T times |w|. Elsewhere a kernel that skips the
    intermediate rounding (or adds one) is off by up to one ULP and fails."""
    n = inputs["x"].shape[-1]
    bound = store_bound(exact["out"], case.dtype, exact["out"], n, k=6,
                        amplify=_amplify(inputs, case))
    if case.params["rounding"] == "normed":
        normed = exact["_normed"]
        may_flip = rounding_margin(normed, case.dtype) <= f32_noise(n, 6) * np.abs(normed)
        bound = bound + may_flip * spacing(normed, case.dtype) * np.abs(exact["_w"])
    return {"out": bound}


ROUNDINGS = ("once", "normed")
NORM_PARAMS = {"eps": 1e-6, "weight_offset": 0, "rounding": "once", "ftz": 0}

_row_op("rms_norm", rms_norm, rms_norm_tolerance,
        inputs=(TensorSpec("x", ROWS), TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("out", ROWS),), flops_per_elem=4, doc=rms_norm.__doc__,
        params=NORM_PARAMS)


# --- per-head rms_norm (Qwen3 q_norm / k_norm) -------------------------------------------------

HEADS = lambda d: (d["batch"], d["tokens"], d["heads"], d["head_dim"])  # noqa: E731


def rms_norm_per_head(inputs: dict, case) -> dict:
    """q_norm/k_norm: x [batch, tokens, heads, head_dim] T normalised over head_dim with one
    weight [head_dim] broadcast to every head (rows = batch·tokens·heads); math, `rounding` param
    and tolerance as `rms_norm`."""
    return rms_norm(inputs, case)


_row_op("rms_norm_per_head", rms_norm_per_head, rms_norm_tolerance,
        inputs=(TensorSpec("x", HEADS), TensorSpec("w", lambda d: (d["head_dim"],), init="weight")),
        outputs=(TensorSpec("out", HEADS),), flops_per_elem=4,
        dims=("batch", "tokens", "heads", "head_dim"), doc=rms_norm_per_head.__doc__,
        params=NORM_PARAMS)


# --- rms_norm_residual (FFAI) --------------------------------------------------------------------

def rms_norm_residual(inputs: dict, case) -> dict:
    """out = residual + (w + weight_offset) · x · rsqrt(mean(x²) + eps), one store rounding.

    The f32 noise is relative to |residual| + |normed| (the sum may cancel); k = 8 adds the
    residual add to `rms_norm`'s count."""
    v = kernel_view(inputs, case)
    x, w, res = v["x"], v["w"], v["residual"]
    normed = x * rms_inv_rows(x, _eps(case)) * (w + case.params["weight_offset"])
    return {"out": res + normed, "_scale": np.abs(res) + np.abs(normed)}


def rms_norm_residual_tolerance(inputs: dict, exact: dict, case) -> dict:
    n = inputs["x"].shape[-1]
    return {"out": store_bound(exact["out"], case.dtype, exact["_scale"], n, k=8,
                               amplify=_amplify(inputs, case))}


_row_op("rms_norm_residual", rms_norm_residual, rms_norm_residual_tolerance,
        inputs=(TensorSpec("x", ROWS), TensorSpec("residual", ROWS),
                TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("out", ROWS),), flops_per_elem=5, doc=rms_norm_residual.__doc__)


# --- add_rms_norm (two outputs) -----------------------------------------------------------------

def add_rms_norm(inputs: dict, case) -> dict:
    """s = a + b; residual_out = T(s); normed_out = T(s · rsqrt(mean(s²) + eps) · w).

    The norm reads the *unrounded* sum s (the kernel keeps it in f32 registers), not
    residual_out. In f32 the sum itself rounds once (k = 8 for normed_out; the residual bound is
    half an ULP of T plus one f32 rounding of s, which also covers the double rounding
    f32 -> f16/bf16)."""
    v = kernel_view(inputs, case)
    s = v["a"] + v["b"]
    normed = s * rms_inv_rows(s, _eps(case)) * (v["w"] + case.params["weight_offset"])
    return {"residual_out": s, "normed_out": normed}


def add_rms_norm_tolerance(inputs: dict, exact: dict, case) -> dict:
    n = inputs["a"].shape[-1]
    s = exact["residual_out"]
    return {"residual_out": 0.5 * spacing(s, case.dtype) * (s != 0) + 0.5 * EPS32 * np.abs(s)
            + subnormal_err(case),
            "normed_out": store_bound(exact["normed_out"], case.dtype, exact["normed_out"], n, k=8,
                                      amplify=_amplify({**inputs, "x": s}, case))}


_row_op("add_rms_norm", add_rms_norm, add_rms_norm_tolerance,
        inputs=(TensorSpec("a", ROWS), TensorSpec("b", ROWS), TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("residual_out", ROWS), TensorSpec("normed_out", ROWS)),
        flops_per_elem=5, doc=add_rms_norm.__doc__)


# --- gated_mixer_norm (Qwen3.5/3.6 GDN output norm) ----------------------------------------------

def silu(z: np.ndarray) -> np.ndarray:
    """z · sigmoid(z), evaluated without overflow for large |z|."""
    return z * 0.5 * (1.0 + np.tanh(0.5 * z))


def gated_mixer_norm(inputs: dict, case) -> dict:
    """out = (y · rsqrt(mean(y²) + eps) · (w + weight_offset)) · silu(z), silu(z) = z/(1+exp(-z)).

    y is float32 (the recurrence output), z and w are T; inv comes from the f32 y. k = 12: exp
    (2 ULP), the silu divide and add, three multiplies, with a 2x margin."""
    v = kernel_view(inputs, case)
    y, z, w = v["y"], v["z"], v["w"]
    normed = y * rms_inv_rows(y, _eps(case)) * (w + case.params["weight_offset"])
    return {"out": normed * silu(z)}


def gated_mixer_norm_tolerance(inputs: dict, exact: dict, case) -> dict:
    n = inputs["y"].shape[-1]
    z = np.abs(_f64(inputs["z"]))
    return {"out": store_bound(exact["out"], case.dtype, exact["out"], n, k=12,
                               amplify=_amplify(inputs, case, data="y") * (1.0 + z))}


_row_op("gated_mixer_norm", gated_mixer_norm, gated_mixer_norm_tolerance,
        inputs=(TensorSpec("y", ROWS, role="f32"), TensorSpec("z", ROWS, init="gate"),
                TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("out", ROWS),), flops_per_elem=9, doc=gated_mixer_norm.__doc__)


# --- rms_inv ---------------------------------------------------------------------------------

def rms_inv(inputs: dict, case) -> dict:
    """inv[r] = rsqrt(sum_i x_ri² / n + eps), float32 per row: the scalar `mt_rms_inv_scalar`
    returns to the fused kernels. The output is f32, so the f32 noise dominates: k = 4 (rsqrt's
    2 ULP with a 2x margin)."""
    return {"inv": rms_inv_rows(kernel_view(inputs, case)["x"], _eps(case))[..., 0]}


def rms_inv_tolerance(inputs: dict, exact: dict, case) -> dict:
    n = inputs["x"].shape[-1]
    inv = exact["inv"]
    return {"inv": 0.5 * spacing(inv, "f32") + f32_noise(n, 4) * np.abs(inv)}



_row_op("rms_inv", rms_inv, rms_inv_tolerance,
        inputs=(TensorSpec("x", ROWS),),
        outputs=(TensorSpec("inv", lambda d: (d["rows"],), role="f32"),),
        flops_per_elem=2, doc=rms_inv.__doc__)
