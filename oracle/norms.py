"""RMSNorm family oracles (seeds: metaltile-std `src/mlx/rms_norm.rs`, `src/mlx/unary.rs`'s
`mt_add_rms_norm`, `src/ffai/rms_norm_residual.rs`, `gated_rmsnorm.rs`; conventions: HF's Llama
and Gemma RMSNorms).

Common math, per row r of length n (the last axis):

    inv_r = rsqrt(sum_i x_ri^2 / n + eps)          eps read as float32 (the kernels' eps_buf)
    out_ri = x_ri * inv_r * (w_i + weight_offset)  weight_offset 0 (Llama/Qwen) or 1 (Gemma)

Rounding points: inputs are stored in T (f32, f16 or bf16); the kernels load them, compute in
f32, and round to T once, at the store. So the oracle computes in float64 from the T-rounded
inputs and returns the pre-store value; the one rounding to T is applied on the way out. The
HF-Llama convention `w * T(x * inv)` (two roundings) is a different contract, not this one.

Tolerance (derived, not tuned): the admissible kernel's f32 computation, `norm_kernel`, run in
the interval arithmetic of `oracle/numerics.py`, which charges every rounding where it happens:

    s_i = x_i * x_i                     one rounding each
    S   = sum_i s_i                     the impl's declared reduction (default: any order)
    a   = S / n + eps                   the divide (2 ULP: covers S * f32(1/n)) and the add
    inv = rsqrt(a)                      2 ULP (CUDA's rsqrtf; 1/sqrt on a CPU is less)
    w'  = w + weight_offset             one rounding where the offset is not 0
    y   = x * inv * w'                  two roundings, in whichever association is worst
    ["normed": T(x * inv) first, a declared rounding point, then * w']
    out = T(y)                          the store: the farther of T(y - e) and T(y + e)

Subnormal intermediates (tiny inputs) are charged 2^-150 per rounding, or their whole magnitude
below 2^-126 under FTZ (param `ftz`: a backend that flushes f32 subnormals to zero, e.g. every
CuPy kernel, compiled with -ftz=true; Metal's fast math likewise; the oracle then also reads every
input as the kernel does after widening to f32, subnormals as 0). Where the kernel's own x*inv may
land on either side of a midpoint of T (rounding "normed"), the declared rounding point carries
the distance to the other neighbour. All-zero rows give bound 0: out must be exactly 0.

Against the seeds (`docs/seed_kernels.md`, absolute tolerances for outputs ~1: mt_rms_norm
f32 1e-4 / f16 2e-2 / bf16 1e-1, per-head 1e-4 / 5e-3 / 5e-2): for a kernel reducing over 32
lanes or more (every seed kernel: a SIMD group is 32 wide) the f32 bound at n = 8192 is ~1e-5;
an impl that declares no order is held to the any-order bound, (n/4) u relative at inv, 1.2e-4
at n = 8192. `tests/test_norms_oracle` checks the 32-lane bounds over every gate case.

Domain: the kernel squares and sums in f32, which overflows once mean(x²) passes 3.4e38, i.e.
|x| ≳ 1.8e19 (f32 and bf16 inputs; f16 cannot hold them). There an f32 kernel's sum is inf and
inv = rsqrt(inf) = 0, so out = 0 (or residual, for rms_norm_residual), while a kernel that scales
the row first gets the exact answer: the contract admits both, and the bound (`Val.rsqrt`)
spans them, [0, |y|]. The `f32_overflow` cases hold such rows; anything else still fails there.
An impl that declares its sum's overflow (`Numerics.overflow = "inf"`: it never rescales) is
held to IEEE's answer instead: the runner sets the param `overflow` = "inf" on the case the
oracle runs (as `ftz`), and a row whose exact sum of squares is at least 2 · 3.4e38 (so every
f32 order of it reaches inf) has inv = 0 exactly, in the oracle and in the bound: out = ±0
(residual for rms_norm_residual) and nothing else passes. Rows nearer the edge keep both answers.

At the other end, eps = 0 (as the kernel reads it: f32(eps), and 0 under `ftz` when below
2^-126) leaves nothing between mean(x²) and rsqrt: y = x · rsqrt(mean(x²)). In f32 a square
x² ≤ 2^-150 (half the smallest subnormal 2^-149; the tie rounds to even, 0) rounds to 0, so a row
with every |x| ≤ 2^-75 ≈ 2.6e-23 has mean(x²) = 0 exactly, inv = rsqrt(0) = inf, and the kernel's
IEEE answer is out = ±inf (NaN where x·w = 0; rms_inv's inv = inf), whatever the f64 oracle's
finite value: no finite bound holds, and every correct impl (torch `F.rms_norm`, MLX, any CPU
code) "fails". Such a case is outside the op's domain (`eps_domain`, every op of this module,
through `OpSpec.domain`: a case file's case is refused at load, exit 2, naming eps and the fix,
eps > 0 as every model has, e.g. 1e-6; fuzzed cases keep out of it). Precisely: f32(eps) = 0,
dist `tiny`, and the normed input (x; y of gated_mixer_norm, f32 whatever T is; a and b of
add_rms_norm, s = a + b) stored in a dtype D whose smallest normal tiny(D) ≤ 2^-81: `tiny` draws
N(0, 1) · 4 · tiny(D) (`cases/distributions.py`), |z| < 8 (past 8: probability 1e-15 per draw)
and a sum of two at most doubles it, so every |x| < 64 · tiny(D) ≤ 2^-75. That is f32 and bf16
(tiny = 2^-126: |x| < 2^-120, every square 0); f16 (tiny = 2^-14) keeps mean(x²) ~ 2^-24, a
normal f32, inv ~ 2^12 finite, and still runs with eps = 0, as does every other distribution
(zero rows included: 0 · rsqrt(0) = NaN in the oracle as in the kernel).

NaN and inf inputs (the `nonfinite` distribution): IEEE propagation through the formula above
is the contract. A row holding a NaN is NaN throughout. A row holding ±inf (no NaN) has
sum x^2 = inf, so inv = rsqrt(inf) = 0: its finite elements give exactly ±0 and the infinite
one inf·0 = NaN. With a residual (s = x + r) the same holds for s, and inf - inf = NaN. The
check requires NaN exactly where the oracle has NaN, the same infinity where it has one, and
within-bound values elsewhere (`oracle/metrics.py`): a kernel that clamps, skips or zeroes
non-finite values fails.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import eps as dtype_eps, tiny
from oracle.builders import kernel_view, silu  # noqa: F401 (re-exported: families import them)
from oracle.dtypes import round_to
from oracle.numerics import Numerics, Val, exact_where, lanes
from oracle.spec import OpSpec, TensorSpec, register

EPS32 = dtype_eps("f32")
# The seeds' own test tolerances (absolute, outputs ~1): the loosest a bound may ever be.
# mt_add_rms_norm's legacy 1e-3 (one value for every dtype, checked against MLX's own kernel on
# the same GPU) is below one ULP of f16/bf16 at 1.0, which no rounded output can meet against an
# exact oracle; for f16/bf16 it takes the bounds of its TPG = n/4 siblings. gated_mixer_norm
# takes ffai_gated_rmsnorm's (identical math); rms_inv has none and takes mt_rms_norm's f32 bound;
# gated_group_rmsnorm (`oracle/gated_norm.py`: ffai_gated_group_rmsnorm, which states none)
# takes its gate-after-norm sibling ffai_gated_rmsnorm's.
SEED_TOL = {
    "rms_norm": {"f32": 1e-4, "f16": 2e-2, "bf16": 1e-1},
    "rms_norm_per_head": {"f32": 1e-4, "f16": 5e-3, "bf16": 5e-2},
    "rms_norm_residual": {"f32": 1e-4, "f16": 2e-2, "bf16": 1e-1},
    "add_rms_norm": {"f32": 1e-3, "f16": 2e-2, "bf16": 1e-1},
    "gated_mixer_norm": {"f32": 1e-4, "f16": 2e-2, "bf16": 8e-2},
    "rms_inv": {"f32": 1e-4, "f16": 1e-4, "bf16": 1e-4},
    "gated_group_rmsnorm": {"f32": 1e-4, "f16": 2e-2, "bf16": 8e-2},
}


TINY32 = float(np.finfo(np.float32).tiny)
# The seed kernels' reductions: threads of a threadgroup (a SIMD group is 32 wide) each summing a
# strided share of the row, then a tree: at least 32 lanes. The seed-tolerance tests compare
# the bound for this class of kernel with the seeds' tolerances.
SEED_NUMERICS = Numerics(lanes(32))


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _eps(case) -> float:
    return float(np.float32(case.params["eps"]))


# An exact sum of squares at least this large reaches inf in every f32 order (module docstring,
# "Domain"): twice f32's largest value, far beyond any f32 sum's relative error.
OVERFLOW_SURE = 2.0 * float(np.finfo(np.float32).max)
OVERFLOWS = ("either", "inf")  # the param `overflow`: undeclared, or IEEE's declared


def overflows(case) -> bool:
    """Whether the case's oracle holds the kernel to IEEE's answer past f32's range."""
    return case.params.get("overflow", "either") == "inf"


def rms_inv_rows(x: np.ndarray, eps: float, ieee_overflow: bool = False) -> np.ndarray:
    """rsqrt(mean(x^2) + eps) along the last axis, keepdims, float64; with `ieee_overflow`, 0
    where the exact sum of squares is OVERFLOW_SURE or more (rsqrt(inf) of an f32 kernel)."""
    x = _f64(x)
    with np.errstate(divide="ignore", over="ignore"):  # mean 0, eps 0 (zero rows): inf, IEEE's
        squares = np.sum(x * x, axis=-1, keepdims=True)
        inv = 1.0 / np.sqrt(squares / x.shape[-1] + eps)
    return np.where(squares >= OVERFLOW_SURE, 0.0, inv) if ieee_overflow else inv


EPS_ZERO_MAX_TINY = 2.0 ** -81  # `eps_domain`: 64 · tiny(D) ≤ 2^-75, where every f32 square is 0


def _kernel_eps(case) -> float:
    """eps as the kernel adds it: f32(eps), flushed to 0 under `ftz` when subnormal."""
    e = _eps(case)
    return 0.0 if case.params.get("ftz") and abs(e) < TINY32 else e


def eps_domain(*normed: str):
    """The domain of an RMSNorm op whose norm reads the inputs `normed` (module docstring,
    "Domain"): eps = 0 with `tiny` data whose every f32 square rounds to 0 is refused, since
    mean(x²) + eps = 0 there and a correct kernel returns inf."""

    def check(case) -> None:
        if case.params.get("overflow", "either") not in OVERFLOWS:
            raise ValueError(f"{case.op}: params.overflow = {case.params['overflow']!r}: one of "
                             f"{', '.join(OVERFLOWS)} (the runner sets it from the impl's "
                             f"declared numerics; a case file need not)")
        if case.dist != "tiny" or _kernel_eps(case) != 0.0:
            return
        dtypes = sorted({t.dtype(case) for t in case.spec.inputs if t.name in normed})
        if max(tiny(d) for d in dtypes) > EPS_ZERO_MAX_TINY:
            return
        given = case.params["eps"]
        shown = f"eps = {given}" + (" (0 as the kernel reads it)" if given != 0 else "")
        raise ValueError(
            f"{case.op}: {shown} with dist tiny in {'/'.join(dtypes)}: every x² underflows f32 "
            f"to 0, so mean(x²) + eps = 0 and a correct kernel's rsqrt gives inf (no finite "
            f"bound holds); use eps > 0 (e.g. 1e-6, as every model does)")

    return check


def _kernel_inputs(arith, inputs: dict, case, names) -> list:
    v = kernel_view({k: inputs[k] for k in names}, case)
    return [arith.load(v[k]) for k in names]


def inv_kernel(A, x, case):
    """inv = rsqrt(sum(x*x) / n + eps) per row, in the arithmetic A (the kernel model); exactly
    0 where the declared IEEE overflow is sure (`overflows`)."""
    n = x.shape[-1]
    inv = (A.sum(x * x) / A.load(float(n)) + A.load(_eps(case))).rsqrt()
    if not overflows(case):
        return inv
    exact = x.v if isinstance(x, Val) else x.x  # as loaded: the kernel's inputs, exact
    with np.errstate(over="ignore"):
        sure = np.sum(exact * exact, axis=-1) >= OVERFLOW_SURE
    return exact_where(inv, sure, 0.0)


def weight_kernel(A, w, case):
    offset = case.params.get("weight_offset", 0)
    return w + A.load(float(offset)) if offset else w


def norm_kernel(A, x, w, case):
    """x * inv * (w + offset), with the contract's rounding point for "normed"."""
    inv = A.keep(inv_kernel(A, x, case))
    w = weight_kernel(A, w, case)
    if case.params.get("rounding") == "normed":
        return (x * inv).round_to(case.dtype) * w
    return A.prod3(x, inv, w)


def _row_op(name: str, oracle, kernel, inputs, outputs, flops_per_elem: int, doc: str,
            dims=("rows", "n"), params=None, param_values=None, chain_input="x",
            conventions=(), normed=("x",)) -> OpSpec:
    def elems(case) -> int:
        return int(np.prod([case.dims[d] for d in dims]))

    return register(OpSpec(
        name=name, family="norms", dims=dims, inputs=inputs, outputs=outputs,
        oracle=oracle, tolerance=None, kernel=kernel,
        bytes=lambda case: get_bytes(name, case),
        flops=lambda case: flops_per_elem * elems(case),
        params=params or {"eps": 1e-6, "weight_offset": 0, "ftz": 0, "overflow": "either"},
        param_values=param_values or {}, doc=doc, version=2, chain_input=chain_input,
        conventions=conventions, domain=eps_domain(*normed)))


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
    A kernel that skips the intermediate rounding (or adds one) is off by up to one ULP of T
    wherever x·inv is not within its own f32 noise of a midpoint of T, and fails there."""
    v = kernel_view(inputs, case)
    x, w = v["x"], v["w"]
    normed = x * rms_inv_rows(x, _eps(case), overflows(case))
    w = w + case.params["weight_offset"]
    if case.params["rounding"] == "normed":
        rounded = round_to(normed, case.dtype).astype(np.float64)
        return {"out": rounded * w}
    return {"out": normed * w}


def rms_norm_kernel(A, inputs: dict, case) -> dict:
    x, w = _kernel_inputs(A, inputs, case, ("x", "w"))
    return {"out": norm_kernel(A, x, w, case)}


ROUNDINGS = ("once", "normed")
NORM_PARAMS = {"eps": 1e-6, "weight_offset": 0, "rounding": "once", "ftz": 0,
               "overflow": "either"}

_row_op("rms_norm", rms_norm, rms_norm_kernel,
        inputs=(TensorSpec("x", ROWS), TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("out", ROWS),), flops_per_elem=4, doc=rms_norm.__doc__,
        params=NORM_PARAMS, param_values={"rounding": ROUNDINGS}, conventions=("rounding",))


# --- per-head rms_norm (Qwen3 q_norm / k_norm) -------------------------------------------------

HEADS = lambda d: (d["batch"], d["tokens"], d["heads"], d["head_dim"])  # noqa: E731


def rms_norm_per_head(inputs: dict, case) -> dict:
    """q_norm/k_norm: x [batch, tokens, heads, head_dim] T normalised over head_dim with one
    weight [head_dim] broadcast to every head (rows = batch·tokens·heads); math, `rounding` param
    and kernel model as `rms_norm`."""
    return rms_norm(inputs, case)


_row_op("rms_norm_per_head", rms_norm_per_head, rms_norm_kernel,
        inputs=(TensorSpec("x", HEADS), TensorSpec("w", lambda d: (d["head_dim"],), init="weight")),
        outputs=(TensorSpec("out", HEADS),), flops_per_elem=4,
        dims=("batch", "tokens", "heads", "head_dim"), doc=rms_norm_per_head.__doc__,
        params=NORM_PARAMS, param_values={"rounding": ROUNDINGS}, conventions=("rounding",))


# --- rms_norm_residual (FFAI) --------------------------------------------------------------------

def rms_norm_residual(inputs: dict, case) -> dict:
    """out = residual + (w + weight_offset) · x · rsqrt(mean(x²) + eps), one store rounding.
    The kernel model adds the residual in f32 after `rms_norm`'s product (the sum may cancel:
    its rounding is charged at the sum's magnitude, its operands' errors carried through)."""
    v = kernel_view(inputs, case)
    x, w, res = v["x"], v["w"], v["residual"]
    inv = rms_inv_rows(x, _eps(case), overflows(case))
    normed = x * inv * (w + case.params["weight_offset"])
    return {"out": res + normed}


def rms_norm_residual_kernel(A, inputs: dict, case) -> dict:
    x, w, res = _kernel_inputs(A, inputs, case, ("x", "w", "residual"))
    return {"out": res + norm_kernel(A, x, w, case)}


_row_op("rms_norm_residual", rms_norm_residual, rms_norm_residual_kernel,
        inputs=(TensorSpec("x", ROWS), TensorSpec("residual", ROWS),
                TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("out", ROWS),), flops_per_elem=5, doc=rms_norm_residual.__doc__)


# --- add_rms_norm (two outputs) -----------------------------------------------------------------

def add_rms_norm(inputs: dict, case) -> dict:
    """s = a + b; residual_out = T(s); normed_out = T(s · rsqrt(mean(s²) + eps) · w).

    The norm reads the *unrounded* sum s (the kernel keeps it in f32 registers), not
    residual_out: in the kernel model s carries its f32 rounding into both outputs (for
    T = f16/bf16, residual_out is the double rounding f32 -> T, covered by the store's interval)."""
    v = kernel_view(inputs, case)
    s = v["a"] + v["b"]
    inv = rms_inv_rows(s, _eps(case), overflows(case))
    normed = s * inv * (v["w"] + case.params["weight_offset"])
    return {"residual_out": s, "normed_out": normed}


def add_rms_norm_kernel(A, inputs: dict, case) -> dict:
    a, b, w = _kernel_inputs(A, inputs, case, ("a", "b", "w"))
    s = a + b
    return {"residual_out": s, "normed_out": norm_kernel(A, s, w, case)}


_row_op("add_rms_norm", add_rms_norm, add_rms_norm_kernel,
        inputs=(TensorSpec("a", ROWS), TensorSpec("b", ROWS), TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("residual_out", ROWS), TensorSpec("normed_out", ROWS)),
        flops_per_elem=5, doc=add_rms_norm.__doc__, normed=("a", "b"),
        chain_input="b")  # a: the residual stream, b: the block output just written


# --- gated_mixer_norm (Qwen3.5/3.6 GDN output norm) ----------------------------------------------

def gated_mixer_norm(inputs: dict, case) -> dict:
    """out = (y · rsqrt(mean(y²) + eps) · (w + weight_offset)) · silu(z), silu(z) = z/(1+exp(-z)).

    y is float32 (the recurrence output), z and w are T; inv comes from the f32 y. The kernel
    model forms silu as z / (1 + exp(-z)) (exp 2 ULP, the add, the divide at 2 ULP) and multiplies
    it into the normed value (one rounding)."""
    v = kernel_view(inputs, case)
    y, z, w = v["y"], v["z"], v["w"]
    inv = rms_inv_rows(y, _eps(case), overflows(case))
    normed = y * inv * (w + case.params["weight_offset"])
    return {"out": normed * silu(z)}


def gated_mixer_norm_kernel(A, inputs: dict, case) -> dict:
    y, z, w = _kernel_inputs(A, inputs, case, ("y", "z", "w"))
    gate = z / (A.load(1.0) + z.neg().exp())
    return {"out": norm_kernel(A, y, w, case) * gate}


_row_op("gated_mixer_norm", gated_mixer_norm, gated_mixer_norm_kernel,
        inputs=(TensorSpec("y", ROWS, role="f32"), TensorSpec("z", ROWS, init="gate"),
                TensorSpec("w", ROW_N, init="weight")),
        outputs=(TensorSpec("out", ROWS),), flops_per_elem=9, doc=gated_mixer_norm.__doc__,
        normed=("y",), chain_input="y")  # the recurrence writes y


# --- rms_inv ---------------------------------------------------------------------------------

def rms_inv(inputs: dict, case) -> dict:
    """inv[r] = rsqrt(sum_i x_ri² / n + eps), float32 per row: the scalar `mt_rms_inv_scalar`
    returns to the fused kernels. The output is f32: the kernel model's `inv` is stored as is."""
    x = kernel_view(inputs, case)["x"]
    return {"inv": rms_inv_rows(x, _eps(case), overflows(case))[..., 0]}


def rms_inv_kernel(A, inputs: dict, case) -> dict:
    (x,) = _kernel_inputs(A, inputs, case, ("x",))
    return {"inv": inv_kernel(A, x, case)}


_row_op("rms_inv", rms_inv, rms_inv_kernel,
        inputs=(TensorSpec("x", ROWS),),
        outputs=(TensorSpec("inv", lambda d: (d["rows"],), role="f32"),),
        flops_per_elem=2, doc=rms_inv.__doc__)
