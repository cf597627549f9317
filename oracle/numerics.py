"""The floating-point error model every derived tolerance is built from.

A kernel contract fixes the math, the dtypes and the rounding points; it leaves the kernel free
in how it computes in f32 between them (the order of a sum, how a product of three factors
associates, a function's last ULPs). The *admissible* kernels are all of those. This module
bounds, rigorously, how far any admissible kernel's f32 value can be from the exact one, by
carrying an interval around the exact value through the kernel's computation:

    Val(v, e)     v: the exact value of an intermediate (float64, the contract's rounding points
                  applied);  e: a bound on |kernel's value - v| over every admissible kernel.

Each f32 operation propagates the operands' errors exactly over the interval (no first-order
approximation: |ab - a'b'| <= |a| e_b + |b| e_a + e_a e_b, a monotone function's image of
[v - e, v + e]) and then adds its own rounding, charged at the largest magnitude the result can
have, m = |v| + e:

    half an f32 ULP at m            + - * and a correctly rounded divide (u = 2^-24 relative,
                                    2^-150 absolute in the subnormal range; an exact 0 costs 0)
    m itself where m < 2^-126       under FTZ (param `ftz`): the result may flush to zero
    k ULPs at m                     a function with a documented error (`FUNCTION_ULPS`; one
                                    an op declares: `oracle/functions.py`)
    k ULPs of 1 (k 2^-23)           sin and cos, whose range-reduced implementations hold an
                                    absolute error, not a relative one near their zeros

A function of an interval propagates the operand's error through the function exactly: exp's
and rsqrt's monotone image; sin and cos by Taylor's bound, |cos(a + d) - cos(a)| <= |sin a| |d|
+ d^2 / 2 (likewise sin with |cos a|), and never more than |d| (both are 1-Lipschitz). A
function of an exact 0 (sin 0 = 0, cos 0 = 1) is exact in every library.

Tables (`table`): f32 values a kernel computes once from the case's constants (RoPE's
inv_freq), within an impl-declared number of ULPs (a "function" of the table's name in
`FUNCTION_ULPS`) per unit of the entries' conditioning, of the exact ones; an exact 1
(theta^0) is exact. `may_round(T)`: a point where the contract admits holding the value in T
or in f32 (HF's RoPE in T); the oracle does not round there: the bound covers both.

Sums of n terms (`f32_sum`) charge one rounding per addition at the magnitude of the partial
sum it produces; which partial sums exist depends on the order the impl declares (`Reduction`):

    any         (default) every order and tree: the partial sums are bounded by the caterpillar
                of the largest terms first, C_k = sum of the k largest |terms|; sum_k u C_k
                (a tree has at most n-k+1 nodes of k or more leaves, so its j-th largest node
                is at most C_{n-j+1}). For n equal terms that is (n/2) u sum|t|: gamma_{n-1}
                halved, the worst admissible order (sequential, largest first) attains it.
    sequential  index order: the exact partial sums P_k = t_1 + ... + t_k, sum_k half_ulp(|P_k|)
                (data-dependent: a random-sign dot product's partials grow as sqrt(k), so this
                bites where `any` cannot).
    lanes(L)    L lanes, lane j summing t_j, t_{j+L}, ... sequentially, then a balanced tree of
                depth ceil(log2 L) over the lane totals (a SIMD group, a threadgroup).
    plan        a kernel's exact order (`plan`): the term index split into digits (item,
                warp, lane, accumulator, ...), reduced digit by digit, each step sequential,
                a tree of adjacent pairs, or a butterfly (a warp's xor shuffles). A kernel
                whose geometry follows the shape declares it per case (`Impl.numerics`).

An op whose kernel model has several sums names each (`A.sum(t, site=...)`); an impl declares
an order per site (`Numerics.sums`) and, where the contract admits several algebraic forms,
the one it computes (`Numerics.form`, a name the op's oracle defines).

The errors of the additions feed the later partial sums; a first pass bounds the total with
u = 2^-24 per addition and the factor 1 / (1 - count u), a second charges each addition half an
ULP at its exact partial sum plus that total (rigorous, and as tight as the rounding grid).

Declared rounding points (`round_to`): the kernel's f32 value lands on some T value between
RNE_T(v - e) and RNE_T(v + e) (rounding is monotone); the oracle takes RNE_T(v). The new error is
the larger distance from RNE_T(v) to either end: 0 unless the interval straddles a midpoint of T,
one neighbour's gap otherwise, the right one at binade edges. The store (`store_bound`) is the
same step against the exact pre-store value.

`Adverse` is the other side of the same model: a float64 emulation of an admissible kernel,
each rounding charged exactly what `Val` charges, in a direction chosen per rounding site
(`Choices`), sums in the declared order; the property test searches the directions for the
worst kernel. The property test (`tests/test_bounds_corners`)
runs it and the correctly rounded answer on corner inputs: both must stay within the bound, and
the bound with any one term shrunk by 10 % must fail one of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from oracle.dtypes import round_to, spacing
from oracle.functions import Function, function, functions, register_function

U = 2.0 ** -24  # unit roundoff of f32: the relative error of one round-to-nearest
TINY32 = 2.0 ** -126  # smallest normal f32
SUB32 = 2.0 ** -150  # half the smallest f32 subnormal: a subnormal result's rounding error
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
class Reduction:
    """The order an impl sums n terms in: "any" (undeclared), "sequential", "lanes" (L) or
    "plan" (a kernel's exact order: `plan`)."""

    kind: str = "any"
    lanes: int = 1
    # "plan" only: the term index as mixed-radix digits, outermost first ((name, size), ...),
    # and the steps that reduce them, in the kernel's order ((names, how), ...).
    layout: tuple[tuple[str, int], ...] = ()
    steps: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.kind not in ("any", "sequential", "lanes", "plan"):
            raise ValueError(f"unknown reduction {self.kind!r}: any, sequential, lanes or plan")
        if self.kind == "lanes" and self.lanes < 2:
            raise ValueError("a lanes reduction needs at least 2 lanes")
        if self.kind == "plan":
            _check_plan(self.layout, self.steps)

    def __str__(self) -> str:
        if self.kind == "lanes":
            return f"lanes({self.lanes})"
        if self.kind == "plan":
            digits = " ".join(f"{name}{size}" for name, size in self.layout)
            return f"plan({digits}: " + ", ".join(f"{HOW_SHORT[how]}({names})"
                                                  for names, how in self.steps) + ")"
        return self.kind

    @property
    def terms(self) -> int:
        """The most terms a plan covers (its digits' product)."""
        return int(np.prod([size for _, size in self.layout]))

    @property
    def fuses(self) -> bool:
        """Whether the terms' products are fused into the sum (a plan whose first step is an
        FMA chain): the model leaves them unrounded (`product_into`)."""
        return self.kind == "plan" and self.steps[0][1] == "fma"


ANY_ORDER = Reduction("any")
SEQUENTIAL = Reduction("sequential")


def lanes(n: int) -> Reduction:
    return Reduction("lanes", n)


# How a plan's step sums the terms along its digits (flattened, outermost first):
#   sequential  one chain in index order (a thread's accumulator; a loop over warps' partials)
#   fma         one chain of FMAs from 0 (acc = fma(a, b, acc)): the terms are exact products
#               (`Bounds.fused`), and every step rounds once, the first (0 + a b) included
#   pairwise    a balanced tree of adjacent pairs: (t0 + t1) + (t2 + t3), ...
#   butterfly   a tree pairing i with i + m/2, then i + m/4, ...: a warp's __shfl_xor_sync
#               loop from the highest offset down (m a power of two)
HOW_SHORT = {"sequential": "seq", "fma": "fma", "pairwise": "pair", "butterfly": "xor"}


def _check_plan(layout, steps) -> None:
    names = [name for name, _ in layout]
    if not layout or len(set(names)) != len(names):
        raise ValueError(f"a plan's layout names each digit once: {layout}")
    for name, size in layout:
        if not (isinstance(size, int) and size >= 1):
            raise ValueError(f"plan digit {name!r} has size {size!r}: an int >= 1")
    seen = []
    for step_names, how in steps:
        if how not in HOW_SHORT:
            raise ValueError(f"plan step {step_names!r}: how {how!r} is not one of "
                             f"{sorted(HOW_SHORT)}")
        digits = step_names.split()
        unknown = [d for d in digits if d not in names]
        if unknown or not digits:
            raise ValueError(f"plan step {step_names!r} names digits {unknown or '(none)'} "
                             f"outside the layout {names}")
        size = int(np.prod([dict(layout)[d] for d in digits]))
        if how == "butterfly" and size & (size - 1):
            raise ValueError(f"plan step {step_names!r}: a butterfly over {size} terms needs a "
                             "power of two")
        seen += digits
    if sorted(seen) != sorted(names):
        raise ValueError(f"a plan's steps reduce every digit exactly once: layout {names}, "
                         f"steps reduce {seen}")


def plan(layout: Mapping[str, int], *steps: tuple[str, str]) -> Reduction:
    """A kernel's exact summation order. `layout`: term i's index written as digits, outermost
    first (i = ((d_0 * s_1 + d_1) * s_2 + d_2) ..., e.g. {"item": 4, "thread": 256, "acc": 4});
    terms past n are absent (never added). `steps`: (digits, how) in the order the kernel
    reduces them, e.g. ("item", "sequential"), ("acc", "pairwise"), ("thread", "butterfly")."""
    return Reduction("plan", layout=tuple((str(k), int(v)) for k, v in layout.items()),
                     steps=tuple((str(names), str(how)) for names, how in steps))


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

    def __str__(self) -> str:
        block = f", softmax_block={self.softmax_block}" if self.softmax_block else ""
        form = f", form={self.form}" if self.form else ""
        sites = "".join(f", {site}={order}" for site, order in self.sums)
        overflow = f", overflow={self.overflow}" if self.overflow else ""
        return f"reduction={self.reduction}{block}{form}{sites}{overflow}"

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


# --- one rounding -----------------------------------------------------------------------------

MAX32 = float(np.finfo(np.float32).max)
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


# --- the interval value -------------------------------------------------------------------------

@dataclass
class Val:
    """An intermediate: exact value `v` and error bound `e` (arrays, broadcast together)."""

    v: np.ndarray
    e: np.ndarray
    m: Model

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self.v)

    @staticmethod
    def exact(x, model: Model) -> "Val":
        v = np.asarray(x, dtype=np.float64)
        return Val(v, np.zeros_like(v), model)

    def _rounded(self, v, e) -> "Val":
        return _finite(Val(v, e + self.m.rnd(np.abs(v) + e, low=np.abs(v) - e), self.m))

    def __add__(self, o: "Val") -> "Val":
        return self._rounded(self.v + o.v, self.e + o.e)

    def __sub__(self, o: "Val") -> "Val":
        return self._rounded(self.v - o.v, self.e + o.e)

    def __mul__(self, o: "Val") -> "Val":
        return self._rounded(self.v * o.v, np.abs(self.v) * o.e + np.abs(o.v) * self.e
                             + self.e * o.e)

    def __truediv__(self, o: "Val") -> "Val":
        v = self.v / o.v
        low = np.abs(o.v) - o.e
        e = np.where(low > 0, (self.e + np.abs(v) * o.e) / np.where(low > 0, low, 1.0), np.inf)
        # A divisor past f32's range is inf in the kernel (exp(88.8) overflows): its quotient is
        # 0 there, while the exact quotient is at most |a| / MAX32 (float64 may round it to 0).
        overflow = np.abs(o.v) + o.e > MAX32
        e = np.where(overflow, e + np.maximum(np.abs(v), np.abs(self.v) / MAX32), e)
        return _finite(Val(v, e + self.m.func("div", np.abs(v) + e, np.abs(v) - e), self.m))

    def call(self, name: str) -> "Val":
        """The registered function `name` of this interval (`oracle/functions.py`): its own
        form, or a monotone function's image of [v - e, v + e] plus its ULPs at the result's
        largest magnitude (a backend's overflow past f32's range, `Model.overflow`)."""
        f = function(name)
        if f.interval is not None:
            return f.interval(self)
        low_arg, high_arg = self.v - self.e, self.v + self.e
        inside = (low_arg > f.domain[0]) & (high_arg < f.domain[1])
        with np.errstate(all="ignore"):
            v = f.exact(self.v)
            lo, hi = (f.exact(np.where(inside, arg, self.v)) for arg in (low_arg, high_arg))
            e = np.where(inside, np.maximum(np.abs(lo - v), np.abs(hi - v)), np.inf)
            # the least magnitude the result has (0 where the image holds 0): under FTZ a
            # result whose interval straddles 2^-126 may flush (`Model.func`)
            least = np.where(lo * hi > 0, np.minimum(np.abs(lo), np.abs(hi)), 0.0)
            e = e + self.m.func(name, np.abs(v) + e, least)
        return _finite(Val(v, self.m.overflow(name, high_arg, v, e), self.m))

    def exp(self) -> "Val":
        return self.call("exp")

    def log(self) -> "Val":
        return self.call("log")

    def rsqrt(self) -> "Val":
        return self.call("rsqrt")

    def cos(self) -> "Val":
        return self.call("cos")

    def sin(self) -> "Val":
        return self.call("sin")

    def may_round(self, dtype: str) -> "Val":
        """The kernel may hold this value in `dtype` here, or keep it in f32 (the oracle does
        not round): any value of [RNE_T(v - e), RNE_T(v + e)] or of [v - e, v + e]."""
        if dtype == "f32":  # an f32 value held in f32 is itself
            return self
        with np.errstate(invalid="ignore"):
            lo = round_to(self.v - self.e, dtype).astype(np.float64)
            hi = round_to(self.v + self.e, dtype).astype(np.float64)
            e = np.maximum(self.e, np.maximum(np.abs(hi - self.v), np.abs(self.v - lo)))
        return _finite(Val(self.v, e, self.m))
    def max(self) -> "Val":
        """The maximum along the last axis: exact in f32 (no rounding), and 1-Lipschitz in the
        largest error, |max a' - max a| <= max e."""
        e = np.broadcast_to(self.e, self.v.shape)
        return _finite(Val(self.v.max(axis=-1), e.max(axis=-1, initial=0.0), self.m))

    def minus_max(self) -> "Val":
        """a - max(a) along the last axis, as a softmax forms its exponents: one rounding, after
        the error of the difference to the kernel's own max. Against t*, the exact argmax: the
        kernel's max exceeds its own s_t* by at most off = max_{t != t*} (d_t + e_t + e_t*)^+
        (d_t = a_t - a_t*: 0 unless another term may overtake t*), so term t's error is
        e_t + e_t* + off, and t*'s only off (its difference to itself is an exact 0). Sharper
        than e_t + max e: the errors the terms share (a large logit's) cancel, as they do in
        the kernel."""
        e = np.broadcast_to(self.e, self.v.shape)
        star = np.argmax(self.v, axis=-1)[..., None]
        is_star = np.arange(self.v.shape[-1]) == star
        with np.errstate(invalid="ignore"):
            d = self.v - np.take_along_axis(self.v, star, axis=-1)
            e_star = np.take_along_axis(e, star, axis=-1)
            reach = np.where(is_star, -np.inf, d + e + e_star)
            off = np.maximum(reach.max(axis=-1, keepdims=True, initial=-np.inf), 0.0)
            return _finite(self._rounded(d, np.where(is_star, off, e + e_star + off)))

    def neg(self) -> "Val":
        return Val(-self.v, self.e, self.m)

    def reshape(self, *shape) -> "Val":
        return Val(self.v.reshape(*shape), np.broadcast_to(self.e, self.v.shape).reshape(*shape),
                   self.m)

    def at(self, index) -> "Val":
        return Val(self.v[index], np.broadcast_to(self.e, self.v.shape)[index], self.m)

    def round_to(self, dtype: str) -> "Val":
        """A declared rounding point: see the module docstring."""
        c = round_to(self.v, dtype).astype(np.float64)
        lo = round_to(self.v - self.e, dtype).astype(np.float64)
        hi = round_to(self.v + self.e, dtype).astype(np.float64)
        return Val(c, np.maximum(np.abs(hi - c), np.abs(c - lo)), self.m)


def _finite(a: Val) -> Val:
    """Where the exact value is NaN or infinite, IEEE propagation makes it exactly (the check's
    NaN/Inf rule judges it): no error to carry. An exact 0 from an infinite operand (rsqrt(inf))
    is exact too."""
    with np.errstate(invalid="ignore"):
        e = np.where(np.isfinite(a.v), a.e, 0.0)
    return Val(a.v, np.where(np.isnan(e), np.inf, e), a.m)


def prod3(a: Val, b: Val, c: Val) -> Val:
    """a·b·c in whichever association the kernel picks: the largest error of the three."""
    options = (a * b * c, a * (b * c), (a * c) * b)
    return Val(options[0].v, np.maximum.reduce([o.e for o in options]), a.m)


def store_bound(y: Val, dtype: str) -> np.ndarray:
    """Bound on |stored - exact| when the kernel's f32 value (within y.e of y.v) is stored as
    `dtype`: the farther of RNE_T(v - e) and RNE_T(v + e) from v (an f32 store is the value
    itself, whose last rounding `y.e` already holds)."""
    v, e = y.v, y.e
    slack = F64_SLACK * np.abs(v)
    if dtype == "f32":
        return np.where(e == 0, 0.0, e + slack)
    lo = round_to(v - e, dtype).astype(np.float64)
    hi = round_to(v + e, dtype).astype(np.float64)
    with np.errstate(invalid="ignore"):
        reach = np.maximum(np.abs(hi - v), np.abs(v - lo))
    # Floored at half an ULP of T at v: no T value lies between |RNE_T(v) - v| and that, so the
    # floor admits no other output, and a correctly rounded kernel uses half its budget on
    # average instead of all of it (the budget stays a measure of drift).
    bound = y.m.k("store") * np.maximum(reach, 0.5 * spacing(v, dtype) * (v != 0)) + slack
    return np.where(np.isfinite(v), bound, np.inf)


# --- sums --------------------------------------------------------------------------------------

def _caterpillar(mag: np.ndarray) -> np.ndarray:
    """C_2..C_n: sums of the k largest magnitudes, k = 2..n, along the last axis."""
    return np.cumsum(-np.sort(-mag, axis=-1), axis=-1)[..., 1:]


def _lane_partials(v: np.ndarray, n_lanes: int) -> np.ndarray:
    """The partial sums of L lanes (element i in lane i % L, summed in order) and of the balanced
    tree over the lane totals, along the last axis: only those formed by a real addition (a
    lane or subtree with no element adds nothing, exactly)."""
    n = v.shape[-1]
    steps = -(-n // n_lanes)
    padded = np.zeros(v.shape[:-1] + (steps * n_lanes,))
    padded[..., :n] = v
    within = np.cumsum(padded.reshape(v.shape[:-1] + (steps, n_lanes)), axis=-2)
    level, nodes = within[..., -1, :], []
    added = (np.arange(n_lanes, steps * n_lanes) < n)  # step k >= 1 of lane j holds an element
    real = [within[..., 1:, :].reshape(v.shape[:-1] + (-1,))[..., added]]
    count = np.array([len(range(j, n, n_lanes)) for j in range(n_lanes)])
    while level.shape[-1] > 1:
        if level.shape[-1] % 2:
            level = np.concatenate([level, np.zeros(level.shape[:-1] + (1,))], axis=-1)
            count = np.append(count, 0)
        both = (count[0::2] > 0) & (count[1::2] > 0)
        level, count = level[..., 0::2] + level[..., 1::2], count[0::2] + count[1::2]
        real.append(level[..., both])
    return np.concatenate(real, axis=-1)


def _reduce_last(x: np.ndarray, count: np.ndarray, how: str):
    """One plan step over the last axis of x (`count`: the terms each slot holds, x's trailing
    shape): (the totals, their counts, the partial sums its real additions form). An addition
    with an absent operand (no terms: the kernel adds an exact 0) forms nothing."""
    if how in ("sequential", "fma"):
        run, held = np.cumsum(x, axis=-1), np.cumsum(count, axis=-1)
        if how == "fma":  # every term's step rounds: 0 + a b is a's and b's product rounded
            return run[..., -1], held[..., -1], run[..., count > 0]
        real = (count[..., 1:] > 0) & (held[..., :-1] > 0)
        return run[..., -1], held[..., -1], run[..., 1:][..., real]
    formed = [np.zeros(x.shape[:x.ndim - count.ndim] + (0,))]
    while x.shape[-1] > 1:
        if how == "pairwise":
            if x.shape[-1] % 2:  # the odd one out rises a level alone
                x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,))], axis=-1)
                count = np.concatenate([count, np.zeros(count.shape[:-1] + (1,), int)], axis=-1)
            a, b, ca, cb = x[..., 0::2], x[..., 1::2], count[..., 0::2], count[..., 1::2]
        else:  # butterfly: i with i + m/2
            h = x.shape[-1] // 2
            a, b, ca, cb = x[..., :h], x[..., h:], count[..., :h], count[..., h:]
        x, count = a + b, ca + cb
        formed.append(x[..., (ca > 0) & (cb > 0)])
    return x[..., 0], count[..., 0], np.concatenate(formed, axis=-1)


def _plan_partials(v: np.ndarray, reduction: Reduction) -> np.ndarray:
    """The partial sums a plan's real additions form, along the last axis (`plan`)."""
    n, lead = v.shape[-1], v.shape[:-1]
    if n > reduction.terms:
        raise ValueError(f"the declared order {reduction} covers {reduction.terms} terms, this "
                         f"sum has {n}: the impl's numerics do not describe this case")
    names = [name for name, _ in reduction.layout]
    x = np.zeros(lead + (reduction.terms,))
    x[..., :n] = v
    count = np.zeros(reduction.terms, dtype=np.int64)
    count[:n] = 1
    x = x.reshape(lead + tuple(size for _, size in reduction.layout))
    count = count.reshape(x.shape[len(lead):])
    k, formed = len(lead), []
    for step, how in reduction.steps:
        rest = [d for d in names if d not in step.split()]
        perm = [names.index(d) for d in rest + [d for d in names if d in step.split()]]
        count = count.transpose(perm)
        x = x.transpose(list(range(k)) + [k + p for p in perm])
        kept = count.shape[:len(rest)]
        count = count.reshape(kept + (-1,))
        x = x.reshape(lead + kept + (count.shape[-1],))
        x, count, partials = _reduce_last(x, count, how)
        formed.append(partials)
        names = rest
    return np.concatenate(formed, axis=-1)


def addition_magnitudes(v: np.ndarray, reduction: Reduction) -> np.ndarray:
    """The exact magnitude of every partial sum the additions of `reduction` form (last axis):
    n-1 of them for every order (the caterpillar's bound for "any")."""
    if reduction.kind == "any":
        return _caterpillar(np.abs(v))
    if reduction.kind == "sequential":
        return np.abs(np.cumsum(v, axis=-1)[..., 1:])
    if reduction.kind == "plan":
        return np.abs(_plan_partials(v, reduction))
    return np.abs(_lane_partials(v, reduction.lanes))


def _partial_floor(t: Val, partial: np.ndarray, slack: np.ndarray,
                   reduction: Reduction) -> np.ndarray:
    """The least magnitude each partial sum may have, for FTZ: one below 2^-126 flushes to 0
    (measured: cuda:kp_attn_combine's accumulator cancelling to 1.15e-38 on a `tiny` case). In
    a known order, the exact partial less its slack; in any order, 0 where terms of both signs
    may meet, else the smallest term (a same-sign partial holds at least one)."""
    if reduction.kind != "any":
        return partial - slack
    low, high = t.v - t.e, t.v + t.e
    mixed = (low < 0).any(axis=-1) & (high > 0).any(axis=-1)
    least = np.min(np.maximum(np.abs(t.v) - t.e, 0.0), axis=-1)
    return np.where(mixed, 0.0, least)[..., None]


def f32_sum(t: Val, reduction: Reduction | None = None, site: str | None = None) -> Val:
    """Sum along the last axis in f32, in the order `reduction` (default: the one the model's
    numerics declare for `site`)."""
    m = t.m
    reduction = reduction or m.numerics.order(site)
    with np.errstate(invalid="ignore"):
        v = t.v.sum(axis=-1)
    carried = t.e.sum(axis=-1)
    if t.v.shape[-1] < 2:
        return Val(v, carried, m)
    # the terms as the kernel may see them: for "any", the caterpillar of |t| + e
    partial = addition_magnitudes(t.v if reduction.kind != "any" else np.abs(t.v) + t.e,
                                  reduction)
    count = partial.shape[-1]
    sub = TINY32 if m.ftz else SUB32
    # a subnormal charge per addition whose result may be nonzero (exact zeros stay exact)
    inexact = np.where(carried > 0, count, np.count_nonzero(partial, axis=-1))
    first = (carried + U * partial.sum(axis=-1) + inexact * sub) / max(1.0 - count * U, 0.5)
    slack = first[..., None] + (t.e.sum(axis=-1)[..., None] if reduction.kind == "any" else 0)
    sums = m.rnd(partial + slack, "sum", low=_partial_floor(t, partial, slack, reduction)
                 if m.ftz else None).sum(axis=-1)
    with np.errstate(invalid="ignore"):
        return _finite(Val(v, carried + sums, m))


def exact_where(a, mask, value: float):
    """`value`, exact, where mask (e.g. exp(0) = 1: exact in every library), else a (a `Val`
    or an `Adverse`)."""
    if isinstance(a, Val):
        return Val(np.where(mask, value, a.v), np.where(mask, 0.0, a.e), a.m)
    return Adverse(np.where(mask, value, a.x), a.m, a.ch)


def product_into(A, a, b, site: str):
    """a * b as the sum `site` takes it: unrounded where the declared order fuses products
    (FMAs, `Reduction.fuses`), else rounded."""
    return A.fused(a, b) if A.m.numerics.order(site).fuses else a * b


# --- the worst admissible kernel ------------------------------------------------------------

class Choices:
    """The free choices of one admissible kernel, for `Adverse`: the direction of every rounding
    site in program order (+1, or -1 for the sites in `flips`; 0 everywhere when `exact`), the
    association of each three-factor product and the form of a computation with several. The
    property test searches them for the kernel farthest from the exact answer."""

    def __init__(self, flips=(), assoc: int = 0, form: int = 0, exact: bool = False):
        self.flips, self.assoc, self.form, self.exact = frozenset(flips), assoc, form, exact
        self.sites = 0  # counted while a kernel model runs: the sites of this run

    def sign(self) -> int:
        site, self.sites = self.sites, self.sites + 1
        return 0 if self.exact else (-1 if site in self.flips else 1)


@dataclass
class Adverse:
    """A float64 emulation of one admissible kernel: every rounding charged exactly what `Val`
    charges, in the direction `Choices` gives its site; sums in the declared order (for "any":
    the largest terms first)."""

    x: np.ndarray
    m: Model
    ch: Choices

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self.x)

    def _r(self, v, err=None) -> "Adverse":
        err = self.m.rnd(v) if err is None else err
        sign = self.ch.sign()
        out = v + sign * err
        if self.m.ftz:  # a subnormal result flushes to 0 or stays (fused, reordered): it
            #             never doubles, as v + |v| would (`Model.rnd` charges |v| both ways)
            out = np.where(np.abs(v) < TINY32, v if sign >= 0 else 0.0, out)
        return Adverse(out, self.m, self.ch)

    def __add__(self, o):
        return self._r(self.x + o.x)

    def __sub__(self, o):
        return self._r(self.x - o.x)

    def __mul__(self, o):
        return self._r(self.x * o.x)

    def __truediv__(self, o):
        v = self.x / o.x
        return self._r(v, self.m.func("div", v))

    def call(self, name: str):
        """The registered function `name` (`oracle/functions.py`): its own form, or its exact
        value off by its ULPs at the result in this site's direction."""
        f = function(name)
        if f.adverse is not None:
            return f.adverse(self)
        with np.errstate(all="ignore"):
            v = f.exact(self.x)
        return self._r(v, self.m.func(name, v))

    def rsqrt(self):
        return self.call("rsqrt")

    def exp(self):
        return self.call("exp")

    def cos(self):
        return self.call("cos")

    def sin(self):
        return self.call("sin")

    def may_round(self, dtype: str):
        """The kernel that holds the value in T (where the contract admits it; in f32 the
        emulated f32 value is itself, as `Val.may_round` has it)."""
        return self if dtype == "f32" else self.round_to(dtype)
    def log(self):
        return self.call("log")

    def max(self):
        return Adverse(self.x.max(axis=-1), self.m, self.ch)

    def minus_max(self):
        return self._r(self.x - self.x.max(axis=-1, keepdims=True))

    def neg(self):
        return Adverse(-self.x, self.m, self.ch)

    def reshape(self, *shape):
        return Adverse(self.x.reshape(*shape), self.m, self.ch)

    def at(self, index):
        return Adverse(self.x[index], self.m, self.ch)

    def round_to(self, dtype: str):
        return Adverse(round_to(self.x, dtype).astype(np.float64), self.m, self.ch)


def adverse_prod3(a: Adverse, b: Adverse, c: Adverse) -> Adverse:
    """The association `Choices.assoc` picks (0, 1, 2: as `prod3` lists them)."""
    return (lambda: a * b * c, lambda: a * (b * c), lambda: (a * c) * b)[a.ch.assoc]()


def adverse_sum(t: Adverse, reduction: Reduction | None = None,
                site: str | None = None) -> Adverse:
    """The kernel's sum in the declared order, each partial sum P moved by its rounding charge
    at |P| (partials from the exact running sums: the drift between them is second order)."""
    m = t.m
    reduction = reduction or m.numerics.order(site)
    x = t.x
    if reduction.kind == "any":  # the caterpillar: largest magnitudes first
        order = np.argsort(-np.abs(x), axis=-1, kind="stable")
        x = np.take_along_axis(x, order, axis=-1)
        reduction = SEQUENTIAL
    partial = addition_magnitudes(x, reduction)
    drift = m.rnd(partial, "sum").sum(axis=-1)
    return Adverse(x.sum(axis=-1) + t.ch.sign() * drift, m, t.ch)


def adverse_store(y: Adverse, dtype: str) -> np.ndarray:
    return y.x if dtype == "f32" else round_to(y.x, dtype).astype(np.float64)


# --- one kernel model, two arithmetics -------------------------------------------------------

def table_error(m: Model, name: str, v: np.ndarray, cond) -> np.ndarray:
    """A table entry's charge (`Bounds.table`): `name`'s ULPs at v times `cond`; 0 at v = 1."""
    return np.where(v == 1.0, 0.0, m.func(name, v) * cond)


class Bounds:
    """The arithmetic an op's kernel model runs in to get its tolerance: `Val` intervals."""

    def __init__(self, model: Model):
        self.m = model

    def load(self, x) -> Val:
        """An input as the kernel reads it (exact) or an f32 constant; an interval (a pipeline
        stage's input that an earlier stage's kernel stored, `stored`) as it is."""
        return x if isinstance(x, Val) else Val.exact(x, self.m)

    def table(self, name: str, exact, cond=1.0) -> Val:
        """f32 values the kernel computes from the case's constants, within the impl's `name`
        ULPs of `exact` per unit of `cond` (the values' conditioning; an exact 1 is exact)."""
        v = np.asarray(exact, dtype=np.float64)
        return Val(v, table_error(self.m, name, v, cond), self.m)

    def stored(self, y: Val, dtype: str, center: np.ndarray) -> Val:
        """What a later kernel reads of `y` stored as `dtype` (a pipeline's intermediate), as an
        interval around `center`, the exact composition's value there (the oracle's T-rounded
        output). The kernel stores some T value in [RNE_T(v - e), RNE_T(v + e)] (rounding is
        monotone; an f32 store is the kernel's f32 value, which lies there too). The error is
        the farther end from `center`; `F64_SLACK` covers v's own float64 noise. Under FTZ the
        next kernel may read a subnormal as 0: where the interval reaches below 2^-126 it
        covers 0 too."""
        c = np.asarray(center, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            e = y.e + F64_SLACK * np.abs(y.v)
            lo = round_to(y.v - e, dtype).astype(np.float64)
            hi = round_to(y.v + e, dtype).astype(np.float64)
            e = np.maximum(np.abs(hi - c), np.abs(c - lo))
            if self.m.ftz:
                e = np.where(np.abs(c) - e < TINY32, np.maximum(e, np.abs(c)), e)
        return _finite(Val(c, np.where(np.isfinite(c), e, 0.0), self.m))

    def sum(self, t: Val, reduction: Reduction | None = None, site: str | None = None) -> Val:
        return f32_sum(t, reduction, site)

    def prod3(self, a: Val, b: Val, c: Val) -> Val:
        return prod3(a, b, c)

    @staticmethod
    def fused(a: Val, b: Val) -> Val:
        """a * b as an FMA takes it: not rounded (the FMA's one rounding is its sum's, a plan's
        "fma" step)."""
        return _finite(Val(a.v * b.v, np.abs(a.v) * b.e + np.abs(b.v) * a.e + a.e * b.e, a.m))

    @staticmethod
    def keep(a: Val) -> Val:
        """A per-row value broadcast back over the row (a trailing axis of length 1)."""
        return Val(a.v[..., None], a.e[..., None], a.m)

    @staticmethod
    def concat(parts: list, axis: int = -1) -> Val:
        return Val(np.concatenate([p.v for p in parts], axis=axis),
                   np.concatenate([np.broadcast_to(p.e, p.v.shape) for p in parts], axis=axis),
                   parts[0].m)

    @staticmethod
    def either(*forms: Val) -> Val:
        """The contract admits several forms of one computation: the bound covers them all."""
        return Val(forms[0].v, np.maximum.reduce([f.e for f in forms]), forms[0].m)

    def unit(self, r) -> Val:
        """A factor 1 +- r: errors of several roundings charged in closed form (a softmax
        term's rescale factors, `oracle/attention.py`)."""
        return Val(np.asarray(1.0), np.asarray(r, dtype=np.float64), self.m)

    def store(self, y: Val, dtype: str) -> np.ndarray:
        return store_bound(y, dtype)


class Worst:
    """The arithmetic of one admissible kernel (`Adverse`, `Choices`), for the property test."""

    def __init__(self, model: Model, choices: Choices):
        self.m, self.ch = model, choices

    def load(self, x) -> Adverse:
        return x if isinstance(x, Adverse) else Adverse(np.asarray(x, dtype=np.float64), self.m,
                                                         self.ch)

    def table(self, name: str, exact, cond=1.0) -> Adverse:
        """The table off by its whole charge, in the direction of this site."""
        v = np.asarray(exact, dtype=np.float64)
        return Adverse(v + self.ch.sign() * table_error(self.m, name, v, cond), self.m, self.ch)

    def stored(self, y: Adverse, dtype: str, center: np.ndarray) -> Adverse:
        """This kernel's value stored as `dtype`, as the next stage reads it (an f32 value
        too: the emulation's float64 value rounded to the f32 a kernel would hold; under FTZ
        a subnormal reads as 0)."""
        x = round_to(y.x, dtype).astype(np.float64)
        if self.m.ftz:
            x = np.where(np.abs(x) < TINY32, 0.0, x)
        return Adverse(x, self.m, self.ch)

    def sum(self, t: Adverse, reduction: Reduction | None = None,
            site: str | None = None) -> Adverse:
        return adverse_sum(t, reduction, site)

    @staticmethod
    def fused(a: Adverse, b: Adverse) -> Adverse:
        return Adverse(a.x * b.x, a.m, a.ch)

    def prod3(self, a, b, c) -> Adverse:
        return adverse_prod3(a, b, c)

    @staticmethod
    def keep(a: Adverse) -> Adverse:
        return Adverse(a.x[..., None], a.m, a.ch)

    @staticmethod
    def concat(parts: list, axis: int = -1) -> Adverse:
        return Adverse(np.concatenate([p.x for p in parts], axis=axis), parts[0].m, parts[0].ch)

    def either(self, *forms: Adverse) -> Adverse:
        """The form `Choices.form` picks."""
        return forms[self.ch.form]

    def unit(self, r) -> Adverse:
        """The factor 1 + r or 1 - r, in the direction `Choices` gives its site."""
        return Adverse(1.0 + self.ch.sign() * np.asarray(r, dtype=np.float64), self.m, self.ch)

    def store(self, y: Adverse, dtype: str) -> np.ndarray:
        return adverse_store(y, dtype)


# --- the built-in functions (`oracle/functions.py`: an op registers any other) ------------------
# Their ULPs are `FUNCTION_ULPS`'s; a backend's own are `BACKEND_ULPS`'s (`Numerics.on`).

def _rsqrt_interval(a: Val) -> Val:
    """1/sqrt(a): decreasing, so the worst input is the interval's low end. An input past
    f32's range is inf in the kernel (a sum of squares of |x| > 1.8e19), and rsqrt(inf) = 0:
    the result may be anything from 0 up."""
    v = 1.0 / np.sqrt(a.v)
    low = a.v - a.e
    e = np.where(low > 0, 1.0 / np.sqrt(np.where(low > 0, low, 1.0)) - v, np.inf)
    e = np.where(a.v + a.e > MAX32, np.maximum(e, v), e)
    return _finite(Val(v, np.where(a.v == np.inf, 0.0, e + a.m.func("rsqrt", v + e)), a.m))


def _trig_interval(a: Val, f, other, name: str) -> Val:
    """f(a) for f = sin or cos (`other` the other one): the operand's error through Taylor's
    bound |f(a + d) - f(a)| <= |other(a)| |d| + d^2 / 2, at most |d| (1-Lipschitz); then f's
    ULPs of 1. A point 0 is exact (sin 0 = 0, cos 0 = 1 everywhere)."""
    v = f(a.v)
    e = np.minimum(a.e, np.abs(other(a.v)) * a.e + a.e * a.e / 2)
    e = e + a.m.func(name, np.maximum(np.abs(v) + e, 1.0))
    return _finite(Val(v, np.where((a.v == 0) & (a.e == 0), 0.0, e), a.m))


def _trig_adverse(k: Adverse, f, name: str) -> Adverse:
    v = f(k.x)
    return k._r(v, np.where(k.x == 0, 0.0, k.m.func(name, np.maximum(np.abs(v), 1.0))))


def _sin_interval(a: Val) -> Val:
    return _trig_interval(a, np.sin, np.cos, "sin")


def _cos_interval(a: Val) -> Val:
    return _trig_interval(a, np.cos, np.sin, "cos")


def _sin_adverse(k: Adverse) -> Adverse:
    return _trig_adverse(k, np.sin, "sin")


def _cos_adverse(k: Adverse) -> Adverse:
    return _trig_adverse(k, np.cos, "cos")


def _rsqrt(x):
    return 1.0 / np.sqrt(x)


# exp: increasing and convex (its image's high end is the worst); a backend's exp may return
# inf before f32's range ends (`BACKEND_OVERFLOWS`). log: increasing and concave, on (0, inf).
register_function(Function("exp", np.exp, FUNCTION_ULPS["exp"]))
register_function(Function("log", np.log, FUNCTION_ULPS["log"], domain=(0.0, np.inf)))
register_function(Function("rsqrt", _rsqrt, FUNCTION_ULPS["rsqrt"], "decreasing",
                           domain=(0.0, np.inf), interval=_rsqrt_interval))
register_function(Function("sin", np.sin, FUNCTION_ULPS["sin"], "custom",
                           interval=_sin_interval, adverse=_sin_adverse))
register_function(Function("cos", np.cos, FUNCTION_ULPS["cos"], "custom",
                           interval=_cos_interval, adverse=_cos_adverse))
