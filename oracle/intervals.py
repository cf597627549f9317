"""The interval arithmetic of the error model: `Val`, an exact value and a bound on how far any
admissible kernel's f32 value is from it, carried through + - * /, functions, declared
roundings, stores and sums (`f32_sum`). The rules: `oracle/numerics.py`'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracle.dtypes import round_to, spacing
from oracle.float_model import F64_SLACK, MAX32, SUB32, TINY32, U, Model
from oracle.functions import function
from oracle.sum_orders import Reduction, addition_magnitudes


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
        return finite_errors(Val(v, e + self.m.rnd(np.abs(v) + e, low=np.abs(v) - e), self.m))

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
        return finite_errors(Val(v, e + self.m.func("div", np.abs(v) + e, np.abs(v) - e), self.m))

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
        return finite_errors(Val(v, self.m.overflow(name, high_arg, v, e), self.m))

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
        return finite_errors(Val(self.v, e, self.m))
    def max(self) -> "Val":
        """The maximum along the last axis: exact in f32 (no rounding), and 1-Lipschitz in the
        largest error, |max a' - max a| <= max e."""
        e = np.broadcast_to(self.e, self.v.shape)
        return finite_errors(Val(self.v.max(axis=-1), e.max(axis=-1, initial=0.0), self.m))

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
            return finite_errors(self._rounded(d, np.where(is_star, off, e + e_star + off)))

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


def finite_errors(a: Val) -> Val:
    """`a` with its errors kept only where they mean something. Where the exact value is NaN or
    infinite, IEEE propagation makes it exactly (the check's NaN/Inf rule judges it): no error
    to carry. An exact 0 from an infinite operand (rsqrt(inf)) is exact too."""
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
        return finite_errors(Val(v, carried + sums, m))
