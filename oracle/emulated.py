"""The one answer of a kernel whose declaration fixes all of its f32 arithmetic.

`Numerics.one_answer`: the impl declares every choice its contract leaves open (the form, the
order of every sum, which products an FMA fuses), and its source computes nothing else in f32
(no library function, no division, no order left to the compiler: `fmaf` spelled out, so nvcc
contracts nothing). Such a kernel has exactly one correct f32 result per input; `Emulated` runs
the op's kernel model (the one `Bounds` runs to bound every admissible kernel) computing that
result instead of an interval:

    a + b, a - b, a * b     float64, then rounded to f32 (round to nearest even). Exact: for
                            operands of p = 24 bits, a float64 (53 >= 2p + 2) result rounded again
                            to f32 is the correctly rounded f32 result (Figueroa, 1995).
    fma(a, b, c)            (`fused` a * b, then + c) a b is exact in float64; a b + c is rounded to float64 *to odd*
                            (TwoSum's error term picks the odd neighbour of an inexact sum), then to
                            f32: round-to-odd at 53 >= p + 2 bits, then to nearest at p, is the
                            single rounding of the FMA (Boldo and Melquiond, 2008).
    sums                    in the declared order (`Reduction`: sequential, lanes(L), a plan's
                            steps: FMA chains, sequential chains, pairwise trees, butterflies),
                            each addition rounded as above; absent terms add an exact 0.
    the store               round to nearest even into T (`round_to`).

Anything the declaration leaves open (an order "any", a function's last ULPs, a form the impl did
not name, a three-factor product's association) raises `Undetermined`, naming it: an impl that
declares `one_answer` must declare it all. Under FTZ (param `ftz`) the model is not emulated.

The bound (`one_answer_bound`), with y the emulated f32 result and A = RNE_T(y) the answer:

    f32 outputs     |A - exact| + one f32 ULP at A: the answer, and a last-bit difference
                    (a hardware FMA against this emulation in a case neither side has met)
                    as budget near 1 rather than a failure; two ULPs off fail.
    f16, bf16       max(|A - exact|, half an ULP of T at A), the floor every store bound has
                    (`store_bound`): the answer, and no other T value unless it is nearer to
                    the exact one (the correctly rounded value, where y fell across a midpoint).

A kernel that computes what it declares lands on A exactly and passes with its own error
measured; one that does anything else lands elsewhere, and fails unless it lands within that
last ULP: a code off by one or a dropped term by far more (`tests/test_emulated.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracle.dtypes import round_to, spacing
from oracle.float_model import F64_SLACK, Model
from oracle.sum_orders import Reduction, plan, plan_reduce


class Undetermined(ValueError):
    """The kernel model reached a choice the impl's declaration leaves open."""


def rn32(v) -> np.ndarray:
    """v rounded to the nearest f32 (ties to even), held in float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(v, dtype=np.float64).astype(np.float32).astype(np.float64)


def fma32(p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """RN_f32(p + c) with one rounding, for p an exact product of two f32 values (exact in
    float64) and c an f32 value: float64's sum rounded to odd, then to f32 (module docstring)."""
    p, c = np.broadcast_arrays(np.asarray(p, dtype=np.float64), np.asarray(c, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        back = s - p
        err = (p - (s - back)) + (c - back)  # TwoSum: s + err = p + c exactly
        odd = (s.view(np.int64) & 1) == 1
        toward = np.nextafter(s, np.where(err > 0, np.inf, -np.inf))
        s = np.where((err == 0) | odd | ~np.isfinite(s), s, toward)
    return rn32(s)


@dataclass
class Em:
    """One value of the emulated kernel: f32 values held in float64, or (`fused`) the exact
    products an FMA chain takes unrounded."""

    x: np.ndarray
    fused: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self.x)

    def _plain(self, what: str) -> np.ndarray:
        if self.fused:
            raise Undetermined(f"{what} of a product the declaration fuses into an FMA chain")
        return self.x

    def __add__(self, o: "Em") -> "Em":
        if self.fused != o.fused:  # fma(a, b, c): the fused product plus an f32 value
            product, addend = (self, o) if self.fused else (o, self)
            return Em(fma32(product.x, addend.x))
        return Em(rn32(self._plain("a sum") + o._plain("a sum")))

    def __sub__(self, o: "Em") -> "Em":
        if self.fused != o.fused:
            return self + o.neg()
        return Em(rn32(self._plain("a difference") - o._plain("a difference")))

    def __mul__(self, o: "Em") -> "Em":
        return Em(rn32(self._plain("a product") * o._plain("a product")))

    def __truediv__(self, o: "Em") -> "Em":
        raise Undetermined("a division (CUDA's f32 divide is within 2 ULPs, not one answer)")

    def call(self, name: str) -> "Em":
        raise Undetermined(f"the function {name!r} (its last ULPs are the library's)")

    def exp(self) -> "Em":
        return self.call("exp")

    def log(self) -> "Em":
        return self.call("log")

    def rsqrt(self) -> "Em":
        return self.call("rsqrt")

    def cos(self) -> "Em":
        return self.call("cos")

    def sin(self) -> "Em":
        return self.call("sin")

    def may_round(self, dtype: str) -> "Em":
        if dtype == "f32":
            return self
        raise Undetermined(f"a value the contract lets the kernel hold in f32 or {dtype}")

    def max(self) -> "Em":
        return Em(self._plain("a max").max(axis=-1))

    def minus_max(self) -> "Em":
        x = self._plain("a softmax's exponent")
        return Em(rn32(x - x.max(axis=-1, keepdims=True)))

    def neg(self) -> "Em":
        return Em(-self.x, self.fused)

    def reshape(self, *shape) -> "Em":
        return Em(self.x.reshape(*shape), self.fused)

    def at(self, index) -> "Em":
        return Em(np.broadcast_to(self.x, self.x.shape)[index], self.fused)

    def round_to(self, dtype: str) -> "Em":
        return Em(round_to(self._plain("a rounding point"), dtype).astype(np.float64))


def _reduce_last(x: np.ndarray, count: np.ndarray, how: str):
    """One step of a declared order over the last axis, each addition rounded to f32 (an
    "fma" step: one rounding per term, products exact)."""
    if how in ("sequential", "fma"):
        acc = np.zeros(x.shape[:-1]) if how == "fma" else x[..., 0]
        for i in range(0 if how == "fma" else 1, x.shape[-1]):
            acc = fma32(x[..., i], acc) if how == "fma" else rn32(acc + x[..., i])
        return acc, count.sum(axis=-1), None
    while x.shape[-1] > 1:
        if how == "pairwise":
            if x.shape[-1] % 2:  # the odd one out rises a level alone (+ an exact 0)
                x = np.concatenate([x, np.zeros(x.shape[:-1] + (1,))], axis=-1)
            x = rn32(x[..., 0::2] + x[..., 1::2])
        else:  # butterfly: i with i + m/2
            h = x.shape[-1] // 2
            x = rn32(x[..., :h] + x[..., h:])
    return x[..., 0], count.sum(axis=-1), None


def emulated_sum(t: Em, reduction: Reduction) -> Em:
    """The sum along the last axis in the declared order (module docstring)."""
    n = t.x.shape[-1]
    if reduction.kind == "any":
        raise Undetermined("a sum in any order (the impl declares none for it)")
    if reduction.kind == "sequential":
        reduction = plan({"term": max(n, 1)}, ("term", "fma" if t.fused else "sequential"))
    elif reduction.kind == "lanes":  # L lanes in order, then a tree of adjacent lane totals
        steps = max(1, -(-n // reduction.lanes))
        reduction = plan({"step": steps, "lane": reduction.lanes},
                         ("step", "fma" if t.fused else "sequential"), ("lane", "pairwise"))
    elif t.fused and not reduction.fuses:
        raise Undetermined(f"fused products in a sum whose order {reduction} starts with no FMA")
    if n == 0:
        return Em(np.zeros(t.x.shape[:-1]))
    return Em(plan_reduce(np.asarray(t.x, dtype=np.float64), reduction, _reduce_last)[0])


class Emulated:
    """The arithmetic an op's kernel model runs in to get the one answer of an impl that
    declares `Numerics.one_answer` (module docstring)."""

    def __init__(self, model: Model):
        if model.ftz:
            raise Undetermined("FTZ (the model does not emulate flushing)")
        self.m = model

    def load(self, x) -> Em:
        """An input as the kernel reads it: T values and codes, exact in f32."""
        x = np.asarray(x, dtype=np.float64)
        if not np.array_equal(rn32(x), x, equal_nan=True):
            raise Undetermined("an input that is not an f32 value")
        return Em(x)

    def sum(self, t: Em, reduction: Reduction | None = None, site: str | None = None) -> Em:
        return emulated_sum(t, reduction or self.m.numerics.order(site))

    @staticmethod
    def fused(a: Em, b: Em) -> Em:
        return Em(a._plain("a fused product") * b._plain("a fused product"), fused=True)

    @staticmethod
    def keep(a: Em) -> Em:
        return Em(a.x[..., None], a.fused)

    @staticmethod
    def concat(parts: list, axis: int = -1) -> Em:
        fused = {p.fused for p in parts}
        if len(fused) > 1:
            raise Undetermined("fused products joined with rounded values in one sum")
        return Em(np.concatenate([np.broadcast_to(p.x, p.x.shape) for p in parts], axis=axis),
                  fused.pop())

    @staticmethod
    def either(*forms: Em) -> Em:
        raise Undetermined("the form (the contract admits several; the impl names none)")

    def table(self, name: str, exact, cond=1.0) -> Em:
        raise Undetermined(f"the table {name!r} (its entries are within ULPs, not one value)")

    def stored(self, y: Em, dtype: str, center) -> Em:
        raise Undetermined("a pipeline stage's stored intermediate")

    def prod3(self, a: Em, b: Em, c: Em) -> Em:
        raise Undetermined("a product of three factors (the association is open)")

    def unit(self, r) -> Em:
        raise Undetermined("a factor 1 +- r charged in closed form")

    def store(self, y: Em, dtype: str) -> np.ndarray:
        return round_to(y._plain("the store"), dtype).astype(np.float64)


def one_answer_bound(y: Em, exact, dtype: str) -> np.ndarray:
    """The bound around the answer RNE_T(y) (module docstring); 0 where the exact value is not
    finite (the check's NaN / Inf rule judges it), inf where only the answer is (it left f32's
    range)."""
    answer = round_to(y._plain("the store"), dtype).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.broadcast_to(np.asarray(exact, dtype=np.float64), answer.shape)
        off = np.abs(answer - x) * (1 + F64_SLACK)
        if dtype == "f32":
            bound = off + spacing(answer, "f32")
        else:
            bound = np.maximum(off, 0.5 * spacing(answer, dtype))
        bound = np.where(np.isfinite(answer), bound, np.inf)
    return np.where(np.isfinite(x), bound, 0.0)
