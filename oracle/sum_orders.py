"""The orders an impl may declare for a sum of n terms, and the partial sums each order forms.

`Reduction` is the declaration (`Numerics.reduction`, `Numerics.sums`): "any" order (the
default), "sequential", `lanes(L)` or a kernel's exact `plan`; `addition_magnitudes` gives the
exact partial sums an order's additions form, which `f32_sum` (`oracle/intervals.py`) charges a
rounding each and `adverse_sum` (`oracle/adverse.py`) moves. The bound each order gives:
`oracle/numerics.py`'s docstring, "Sums of n terms".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


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


# --- the partial sums an order forms --------------------------------------------------------------

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


def plan_reduce(v: np.ndarray, reduction: Reduction, reduce_last) -> tuple[np.ndarray, list]:
    """Run a plan's steps over the last axis of v: each step brings its digits to the last axis
    and calls `reduce_last(x, count, how)` -> (totals, their counts, what the step formed);
    terms past n are absent (0, count 0). Returns (the sum, [what each step formed, ...])."""
    n, lead = v.shape[-1], v.shape[:-1]
    if n > reduction.terms:
        raise ValueError(f"the declared order {reduction} covers {reduction.terms} terms, this "
                         f"sum has {n}: the impl's numerics do not describe this case")
    names = [name for name, _ in reduction.layout]
    x = np.zeros(lead + (reduction.terms,), dtype=v.dtype)
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
        x, count, step_formed = reduce_last(x, count, how)
        formed.append(step_formed)
        names = rest
    return x, formed


def _plan_partials(v: np.ndarray, reduction: Reduction) -> np.ndarray:
    """The partial sums a plan's real additions form, along the last axis (`plan`)."""
    return np.concatenate(plan_reduce(v.astype(np.float64), reduction, _reduce_last)[1],
                          axis=-1)


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
