"""What one f32 rounding or function costs: f32's constants, each backend's function ULPs, what
an impl declares about its arithmetic (`Numerics`) and the `Model` that charges a rounding.

The error model these numbers feed: `oracle/numerics.py`'s docstring.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from oracle.functions import function, functions
from oracle.sum_orders import ANY_ORDER, Reduction

U = 2.0 ** -24  # unit roundoff of f32: the relative error of one round-to-nearest
TINY32 = 2.0 ** -126  # smallest normal f32
SUB32 = 2.0 ** -150  # half the smallest f32 subnormal: a subnormal result's rounding error
MAX32 = float(np.finfo(np.float32).max)  # largest finite f32
# The oracle and the kernel model evaluate the exact value in float64 by different formulas
# (they differ by a few float64 ULPs): every bound carries this much relative slack for that,
# 2^16 below an f32 ULP, so a correctly rounded output never fails by float64 noise.
F64_SLACK = 2.0 ** -40

# A function's error in ULPs of f32 at its result, per backend. CUDA: the CUDA C Programming
# Guide's "Mathematical Functions" tables (rsqrtf 2, expf 2; the kernels here use no fast
# intrinsics). CPU torch: rsqrt is 1/sqrt, two correctly rounded steps (< 1.5 ULP, measured max
# 1.48 over the f32 range), exp < 1 ULP (measured 0.56; but 1772 ULP near x = -87 in one run:
# unexplained, tests/test_function_ulps.py). MLX CPU 0.32: rsqrt 1.48; exp (hence
# sigmoid) is a fast approximation whose error grows with |x|: 8 ULP at |x| <= 10, 64 ULP at the
# end of f32's range (measured on 250k points: tests/test_function_ulps.py), charged 96 (1.5x: the
# points not sampled).
# Metal is held to CUDA's table until measured on an Apple GPU. A divide is charged 2 ULP
# everywhere (CUDA's fast-math divide; IEEE's is 0.5).
#
# sin and cos are charged in ULPs of 1 (k 2^-23 absolute): CUDA's sinf/cosf are 2 ULP relative
# (full range, without fast intrinsics), hence within 2 ULPs of 1; CPU torch measured 0.6 ULP
# relative over |x| <= 2^17; MLX CPU 0.32 holds an absolute error (0.65 ULP of 1 over |x| <= 2^17,
# 135 ULP relative near its zeros; tests/test_function_ulps.py): 2 everywhere.
# `inv_freq` is RoPE's table of inverse frequencies (`oracle/rope.py`): within 2 (1 + |ln inv|)
# ULPs of the exact theta^(-2i/R) (scaled) by default: an f32 exponent's rounding carries into
# exp or pow as |ln inv| u relative. Measured (tests/test_rope.py) at most 0.92 (1 + |ln inv|)
# for HF's f32 formulas, 1.45 for MLX's exp(-i ln(theta) / (R/2)); f32 constants rounded from
# float64 are 0.5 ULP (`Impl.numerics` declares it).
# log: CUDA's logf 1 ULP; measured 0.53 (torch CPU) and 0.79 (MLX CPU 0.32) over f32's range;
# charged 2 everywhere.
FUNCTION_ULPS = {"rsqrt": 2.0, "exp": 2.0, "div": 2.0, "sin": 2.0, "cos": 2.0, "inv_freq": 2.0,
                 "log": 2.0}
BACKEND_ULPS = {"cuda": FUNCTION_ULPS, "torch": FUNCTION_ULPS, "metal": FUNCTION_ULPS,
                "mlx": {**FUNCTION_ULPS, "exp": 96.0}}
# Functions whose subnormal results a backend flushes to 0 without FTZ arithmetic (its products
# and sums keep subnormals): MLX 0.32 CPU's exp is 0 from x = -88 down, where the exact result
# falls below 2^-126 (measured; tests/test_attention.py). Charged the result's whole magnitude
# there, as under FTZ.
BACKEND_FLUSHES = {"mlx": ("exp",)}
# Functions a backend returns as inf before f32's range ends, with the argument above which it
# does: MLX 0.32 CPU's exp is inf for every x > 88.0 (f32 overflows at 88.72; measured,
# tests/test_function_ulps.py). A sigmoid 1 / (1 + exp(-z)) is then 0 for z < -88.0 where the
# exact value is a subnormal (silu's far tail: conv1d's f16_overflow cases). Charged by
# `Model.overflow`.
BACKEND_OVERFLOWS = {"mlx": {"exp": 88.0}}


@dataclass(frozen=True)
class Numerics:
    """What an impl declares about its f32 arithmetic (`Impl.numerics`): the order of its sums
    and its functions' ULPs. The default admits every order: sound for any impl, and tighter
    bounds for an impl that says more."""

    reduction: Reduction = ANY_ORDER
    ulps: Mapping[str, float] | None = None  # None: the backend's table (`BACKEND_ULPS`)
    # Functions whose subnormal results flush to 0; None: the backend's (`BACKEND_FLUSHES`).
    flushes: tuple[str, ...] | None = None
    # Softmax kernels (attention): the fewest keys between two rescales of a running sum by
    # e^(m_old - m_new) (an online softmax's block; a split-KV's split), so that a term's
    # weight passes through at most ceil(n / softmax_block) + 1 rescales over n keys (the +1:
    # a final combine). None, the default: undeclared, one rescale per key (any kernel).
    softmax_block: int | None = None
    # Functions that return inf above an argument where f32 still holds the result; None: the
    # backend's (`BACKEND_OVERFLOWS`).
    overflows: Mapping[str, float] | None = None
    # Where the contract admits several algebraic forms, the one the impl computes, by the
    # op's name for it (a quantized GEMV's "chunk_split": `oracle/gemv.py`); None: the worse
    # of every form the contract admits.
    form: str | None = None
    # The order of each named sum of the op's kernel model ((site, Reduction), ...: GEMV's
    # "chunk_dot", "chunk_x", "row"), where it is not `reduction`.
    sums: tuple[tuple[str, Reduction], ...] = ()
    # What an f32 sum past f32's range gives, where the op's contract admits several answers
    # (an RMSNorm's sum of squares: `oracle/norms.py` "Domain"): "inf", IEEE's (the kernel
    # neither rescales nor widens); None: undeclared, every answer the contract admits.
    overflow: str | None = None
    # The declaration fixes every f32 operation (form, every sum's order, the FMAs; no library
    # function): the check holds the impl to the declared kernel's one answer, computed by
    # `oracle/emulated.py`, instead of the interval around every admissible kernel.
    one_answer: bool = False

    def __str__(self) -> str:
        block = f", softmax_block={self.softmax_block}" if self.softmax_block else ""
        form = f", form={self.form}" if self.form else ""
        sites = "".join(f", {site}={order}" for site, order in self.sums)
        overflow = f", overflow={self.overflow}" if self.overflow else ""
        one = ", one answer" if self.one_answer else ""
        return f"reduction={self.reduction}{block}{form}{sites}{overflow}{one}"

    def order(self, site: str | None) -> Reduction:
        """The declared order of the sum `site` (`reduction` where none is named)."""
        return dict(self.sums).get(site, self.reduction) if site else self.reduction

    @property
    def declares_order(self) -> bool:
        return self.reduction.kind != "any" or any(r.kind != "any" for _, r in self.sums)

    def on(self, backend: str) -> "Numerics":
        """These numerics with the backend's function ULPs where the impl declares none."""
        if self.ulps is not None:
            return self
        table = dict(BACKEND_ULPS.get(backend, FUNCTION_ULPS))
        table.update({name: f.ulps_on(backend) for name, f in functions().items()
                      if name not in table})  # the functions ops registered (`functions.py`)
        return dataclasses.replace(
            self, ulps=table,
            flushes=self.flushes if self.flushes is not None
            else BACKEND_FLUSHES.get(backend, ()),
            overflows=self.overflows if self.overflows is not None
            else dict(BACKEND_OVERFLOWS.get(backend, {})))

    def rescales(self, n: int) -> int:
        """The most rescales a softmax term's weight passes through over n keys."""
        if self.softmax_block is None:
            return int(n)
        return -(-int(n) // self.softmax_block) + 1


DEFAULT = Numerics()


# --- one rounding ---------------------------------------------------------------------------------

_EXPONENT = np.uint64(0x7FF0000000000000)


def half_ulp32(m: np.ndarray) -> np.ndarray:
    """Half an f32 ULP at magnitude m (the upper gap at a binade edge; 2^-150 below 2^-126):
    2^(floor(log2 m) - 24), read off m's float64 exponent bits (`dtypes.spacing`'s value, ~20x
    faster: the GEMV bounds call it on every term). In place on one fresh array: at a state's
    size (64 x 64 x 64 x 128, an SSM step at batch 64) the temporaries cost more than the math."""
    given = m
    m = np.abs(np.asarray(m, dtype=np.float64))
    if not isinstance(m, np.ndarray) or not m.flags.c_contiguous or not m.flags.writeable \
            or np.may_share_memory(m, given):
        m = np.array(m, dtype=np.float64, order="C")
    np.minimum(m, MAX32, out=m)
    tiny = m < TINY32
    bits = m.view(np.uint64)
    np.bitwise_and(bits, _EXPONENT, out=bits)  # m's power of two (nan, inf: inf)
    m *= 2.0 ** -24
    if tiny.any():
        m[tiny] = SUB32
    return m


@dataclass(frozen=True)
class Model:
    """How one kernel's roundings are charged: FTZ, the impl's numerics, and `shrink`, a factor
    per kind of term ("round", "func", "sum", "sub", "store") that only the property test sets
    below 1 (to show each term is needed)."""

    ftz: bool = False
    numerics: Numerics = DEFAULT
    shrink: Mapping[str, float] = field(default_factory=dict)

    def k(self, term: str) -> float:
        return self.shrink.get(term, 1.0)

    def rnd(self, m: np.ndarray, term: str = "round", low=None) -> np.ndarray:
        """Largest error of one f32 rounding of a value of magnitude <= m, >= low (default m)
        (`term`: which kind of rounding, for `shrink`: "round" for + - *, "sum" for a
        reduction's additions)."""
        m = np.abs(np.asarray(m, dtype=np.float64))
        err, k = half_ulp32(m), self.k(term)
        if k != 1.0:  # only the property test shrinks a term
            err *= k
        err = err[()] if err.ndim == 0 else err  # a scalar's error: a scalar, as before
        if (m < TINY32).any():  # subnormal results: 2^-150, or flushed (FTZ); exact zeros: 0
            sub = self.k("sub") * (m if self.ftz else np.minimum(m, SUB32))
            err = np.where(m < TINY32, sub, err)
        if self.ftz and low is not None:
            err = self._may_flush(err, m, low)
        return err

    def _may_flush(self, err: np.ndarray, m: np.ndarray, low) -> np.ndarray:
        """Under FTZ, a result whose interval [low, m] straddles 2^-126 may land below it in
        the kernel and flush to 0: up to 2^-126 lost (measured: CuPy's RoPE, x2·sin at
        1.1735e-38 from factors whose exact product's upper bound was normal)."""
        # `low` is the least magnitude (|v| - e): below 0 the interval holds 0 itself
        low = np.maximum(np.asarray(low, dtype=np.float64), 0.0)
        straddles = (low < TINY32) & (m >= TINY32)
        return np.where(straddles, np.maximum(err, self.k("sub") * TINY32), err)

    def func(self, name: str, m: np.ndarray, low=None) -> np.ndarray:
        """A function's error at result magnitude m (>= low, default m): its ULPs at m (in the
        subnormal range, ULPs of 2^-149; under FTZ a subnormal result may flush: its whole
        magnitude)."""
        m = np.abs(np.asarray(m, dtype=np.float64))
        ulps = (self.numerics.ulps or FUNCTION_ULPS).get(name)
        if ulps is None:  # a function an op registered (`oracle/functions.py`)
            ulps = FUNCTION_ULPS[name] if name in FUNCTION_ULPS else function(name).ulps
        err = self.k("func") * ulps * 2.0 * half_ulp32(m)
        if self.ftz or name in (self.numerics.flushes or ()):
            err = np.where(m < TINY32, np.maximum(err, self.k("sub") * m), err)
            if low is not None:
                err = self._may_flush(err, m, low)
        return np.where(m == 0, 0.0, err)

    def overflow(self, name: str, arg_high: np.ndarray, v: np.ndarray, e: np.ndarray
                 ) -> np.ndarray:
        """A function's error `e` at result v, where the backend may return inf above the
        argument its `overflows` names (arg_high: the argument's upper end): the interval's
        upper end past f32's range says the kernel may hold inf (`Val.__truediv__`: the
        quotient may then be 0). Where v is below MAX32 / 2 no interval around v reaches past
        f32's range without reaching 0: unbounded."""
        limit = (self.numerics.overflows or {}).get(name)
        if limit is None:
            return e
        step = half_ulp32(MAX32)
        reach = np.where(2.0 * v - MAX32 > 4.0 * step, np.maximum(e, MAX32 - v + step), np.inf)
        return np.where(arg_high > limit, reach, e)


def model_for(case, numerics: Numerics = DEFAULT, shrink: Mapping[str, float] | None = None
              ) -> Model:
    return Model(bool(case.params.get("ftz")), numerics, shrink or {})
