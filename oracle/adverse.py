"""The other side of the error model: `Adverse`, a float64 emulation of one admissible kernel,
each rounding charged exactly what `Val` charges in a direction `Choices` picks per site, for
the property test's search for the worst kernel (`oracle/numerics.py`'s docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from oracle.dtypes import round_to
from oracle.float_model import TINY32, Model
from oracle.functions import function
from oracle.sum_orders import SEQUENTIAL, Reduction, addition_magnitudes



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

    def rounded(self, v, err=None) -> "Adverse":
        """`v` off by `err` (default: one rounding's charge at v) in this site's direction."""
        err = self.m.rnd(v) if err is None else err
        sign = self.ch.sign()
        out = v + sign * err
        if self.m.ftz:  # a subnormal result flushes to 0 or stays (fused, reordered): it
            #             never doubles, as v + |v| would (`Model.rnd` charges |v| both ways)
            out = np.where(np.abs(v) < TINY32, v if sign >= 0 else 0.0, out)
        return Adverse(out, self.m, self.ch)

    def __add__(self, o):
        return self.rounded(self.x + o.x)

    def __sub__(self, o):
        return self.rounded(self.x - o.x)

    def __mul__(self, o):
        return self.rounded(self.x * o.x)

    def __truediv__(self, o):
        v = self.x / o.x
        return self.rounded(v, self.m.func("div", v))

    def call(self, name: str):
        """The registered function `name` (`oracle/functions.py`): its own form, or its exact
        value off by its ULPs at the result in this site's direction."""
        f = function(name)
        if f.adverse is not None:
            return f.adverse(self)
        with np.errstate(all="ignore"):
            v = f.exact(self.x)
        return self.rounded(v, self.m.func(name, v))

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
        return self.rounded(self.x - self.x.max(axis=-1, keepdims=True))

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
