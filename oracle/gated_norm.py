"""Mamba-2's gated group RMSNorm (issue 30; HF `Zamba2RMSNormGated` as Nemotron-H uses it, the
metaltile fork's `ffai_gated_group_rmsnorm`, `src/ffai/gemv_q8.rs`): Nemotron-H's output norm,
the gate applied before the norm (`norm_before_gate=False`), normalised per group of E/G
channels. A sibling of `oracle/norms.py`'s `gated_mixer_norm` (which gates after the norm, over
the whole row).

y [R, E] (T, the scan's output), z [R, E] (T, the gate), weight [E] (T); per row, per group g of
n = E/G channels:

    x = y · silu(z)                         in f32, silu(z) = z · sigmoid(z)
    x *= rsqrt(mean_g(x²) + eps)            eps param (1e-5, Nemotron-H's), read as f32
    out = weight · x                        param `cast`:
        "once"  T(weight · x): one rounding (mamba_ssm `rms_norm_ref` / Triton `RMSNormGated`,
                the seed's kernel);
        "hf"    T(weight · T(x)): x rounded to T first, then the weight product in T (HF
                `Zamba2RMSNormGated`, Nemotron-H's: `weight * x.to(input_dtype)`).

The oracle computes in float64 from the stored inputs and reproduces the "hf" rounding point;
the store's rounding is `OpSpec.reference`'s. A kernel with the other convention is off by up to
one ULP of T wherever x·inv is not within its own f32 noise of a midpoint of T, and fails there.

Tolerance (derived, `oracle/numerics.py`'s interval arithmetic, `gated_group_kernel`): sigmoid
as 1 / (1 + exp(-z)) (exp's ULPs, the add, the divide at 2 ULP), y · z · sigmoid in the worst
association (two roundings: covers z / (1 + exp(-z)) · y, one rounding fewer); per group the n
squares and their sum in the impl's declared order, the divide by n (2 ULP: covers the multiply
by f32(1/n)), the add of eps, rsqrt at its ULPs (1/sqrt's two roundings are less); then
x · inv · w in the worst association, or with "hf" T(x · inv) as a declared rounding point and
the product by w; then T's store. The seed states no tolerance: the loosest acceptable is
its gate-after-norm sibling `ffai_gated_rmsnorm`'s [1e-4, 2e-2, 8e-2] (f32, f16, bf16; absolute at
outputs ~1; `oracle.norms.SEED_TOL`). The norms' seed guard (tests/test_norms_oracle.py: a
32-lane kernel's bound, the seeds' class, at most the tolerance times max(1, |out|) on every
gate case, with and without FTZ) holds for it; at Nemotron-3-Nano's groups of 512 the f32 bound
of an impl declaring no order is ~1.5e-4 at |out| ~ 11 (1.4e-5 relative), f16 and bf16 are T's
half ULP. Measured (CPU, the gate cases): the torch and MLX f32 impls use at most 64 % of it.

NaN and inf propagate as in IEEE through the formula (`oracle/norms.py`): a group holding a NaN
is NaN throughout; a group holding ±inf (no NaN) has mean(x²) = inf, so its finite elements are
±0 and the infinite one inf · 0 = NaN. An infinite z gives silu(+inf) = inf, silu(-inf) = NaN.
"""

from __future__ import annotations

import numpy as np

from oracle.builders import kernel_view, silu
from oracle.dtypes import round_to
from oracle.spec import BatchDim, OpSpec, TensorSpec, register

CASTS = ("once", "hf")
PARAMS = {"eps": 1e-5, "cast": "once", "ftz": 0}

ROWS = lambda d: (d["rows"], d["dim"])  # noqa: E731
DIM = lambda d: (d["dim"],)  # noqa: E731


def check_domain(case) -> None:
    """The groups must split the row evenly; and eps = 0 with `tiny` y is refused as for the
    other RMSNorms (`oracle.norms.eps_domain`): the normed x = y · silu(z) has |x| < |y| · |z|,
    and the rule's margin (every |y| < 2^-120, so x² underflows f32 for any |z| < 2^45) covers
    any gate."""
    from oracle.norms import eps_domain

    e, g = case.dims["dim"], case.dims["groups"]
    if g < 1 or e % g:
        raise ValueError(f"{case.op}: dim={e} is not a multiple of groups={g} (the norm runs "
                         f"over groups of dim / groups channels): make dim a multiple of groups")
    eps_domain("y")(case)


def _eps(case) -> float:
    return float(np.float32(case.params["eps"]))


def _grouped(a: np.ndarray, case) -> np.ndarray:
    """[R, E] -> [R, G, E/G] (the weight [E] -> [G, E/G])."""
    g = case.dims["groups"]
    return a.reshape(*a.shape[:-1], g, a.shape[-1] // g)


def gated_group_rmsnorm(inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    with np.errstate(invalid="ignore", over="ignore"):
        x = _grouped(v["y"] * silu(v["z"]), case)
        normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + _eps(case))
    if case.params["cast"] == "hf":
        normed = round_to(normed, case.dtype).astype(np.float64)
    out = normed * _grouped(v["weight"], case)
    return {"out": out.reshape(np.shape(v["y"]))}


def gated_group_kernel(A, inputs: dict, case) -> dict:
    v = kernel_view(inputs, case)
    y, z = A.load(_grouped(v["y"], case)), A.load(_grouped(v["z"], case))
    w = A.load(_grouped(v["weight"], case))
    one = A.load(1.0)
    x = A.prod3(y, z, one / (one + z.neg().exp()))
    n = A.load(float(x.shape[-1]))
    inv = A.keep((A.sum(x * x) / n + A.load(_eps(case))).rsqrt())
    if case.params["cast"] == "hf":
        out = (x * inv).round_to(case.dtype) * w
    else:
        out = A.prod3(x, inv, w)
    return {"out": out.reshape(*np.shape(v["y"]))}


register(OpSpec(
    name="gated_group_rmsnorm", family="norms", dims=("rows", "dim", "groups"),
    inputs=(TensorSpec("y", ROWS), TensorSpec("z", ROWS, init="gate"),
            TensorSpec("weight", DIM, init="weight")),
    outputs=(TensorSpec("out", ROWS),),
    oracle=gated_group_rmsnorm, tolerance=None, kernel=gated_group_kernel,
    bytes=lambda case: case.spec.io_bytes(case),
    flops=lambda case: 12 * case.dims["rows"] * case.dims["dim"],
    params=PARAMS, param_values={"cast": CASTS}, domain=check_domain, doc=__doc__,
    batch=BatchDim("rows", ("y", "z"), ("out",)),
    chain_input="y"))  # the scan writes y
