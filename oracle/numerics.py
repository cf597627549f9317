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

A third arithmetic, `oracle/emulated.py`'s `Emulated`, computes the one result of an impl whose
declaration fixes every f32 operation (`Numerics.one_answer`): the check then holds it to that.

This module is the model's one door: it holds the arithmetics a kernel model runs in (`Bounds`,
`Worst`) and hands on the rest from where it lives: the costs and what an impl declares
(`oracle/float_model.py`), the orders of sums (`oracle/sum_orders.py`), `Val`
(`oracle/intervals.py`), `Adverse` (`oracle/adverse.py`) and the built-in functions
(`oracle/builtin_functions.py`).
"""

from __future__ import annotations

import numpy as np

import oracle.builtin_functions  # noqa: F401  (declares exp, log, rsqrt, sin and cos)
from oracle.adverse import Adverse, Choices, adverse_prod3, adverse_store, adverse_sum
from oracle.dtypes import round_to
from oracle.float_model import (BACKEND_FLUSHES, BACKEND_OVERFLOWS, BACKEND_ULPS, DEFAULT,
                                F64_SLACK, FUNCTION_ULPS, MAX32, SUB32, TINY32, U, Model,
                                Numerics, half_ulp32, model_for)
from oracle.intervals import Val, f32_sum, finite_errors, prod3, store_bound
from oracle.sum_orders import (ANY_ORDER, SEQUENTIAL, Reduction, addition_magnitudes, lanes,
                               plan)

# The error model's vocabulary, from the modules that hold it: what an impl declares and what a
# rounding costs (`oracle/float_model.py`, `oracle/sum_orders.py`), the two arithmetics
# (`oracle/intervals.py`, `oracle/adverse.py`), and the kernel models' `A` (below).
__all__ = [
    "ANY_ORDER", "SEQUENTIAL", "Reduction", "addition_magnitudes", "lanes", "plan",
    "BACKEND_FLUSHES", "BACKEND_OVERFLOWS", "BACKEND_ULPS", "DEFAULT", "F64_SLACK",
    "FUNCTION_ULPS", "MAX32", "SUB32", "TINY32", "U", "Model", "Numerics", "half_ulp32",
    "model_for",
    "Val", "f32_sum", "finite_errors", "prod3", "store_bound",
    "Adverse", "Choices", "adverse_prod3", "adverse_store", "adverse_sum",
    "Bounds", "Worst", "exact_where", "product_into", "table_error",
]


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
        return finite_errors(Val(c, np.where(np.isfinite(c), e, 0.0), self.m))

    def sum(self, t: Val, reduction: Reduction | None = None, site: str | None = None) -> Val:
        return f32_sum(t, reduction, site)

    def prod3(self, a: Val, b: Val, c: Val) -> Val:
        return prod3(a, b, c)

    @staticmethod
    def fused(a: Val, b: Val) -> Val:
        """a * b as an FMA takes it: not rounded (the FMA's one rounding is its sum's, a plan's
        "fma" step)."""
        return finite_errors(Val(a.v * b.v, np.abs(a.v) * b.e + np.abs(b.v) * a.e + a.e * b.e, a.m))

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
