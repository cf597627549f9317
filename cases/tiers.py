"""Gate tiers: `commit` (the default of `kparity check` and `pytest -m gpu`) and `nightly`.

`nightly` runs every gate case of an op. `commit` runs, per impl, the smallest of its valid
gate cases that together still show everything the nightly set can tell apart:

- every (dtype, distribution) pair the impl admits: each adversarial, planted and domain class
  on every declared dtype;
- every value of every case parameter (rounding convention, eps, weight offset, layout, ...) on
  every dtype;
- every tile-window and dispatch edge (cases labelled `edge*`: a dim within ±2 of a tile, a
  group or a SIMD width, a state or step-size corner) once per element width (4-byte f32 and
  the 2-byte formats take different vector widths, so a boundary can move with the width);
- every other case label of a kind that is not a model preset (`dist:`, `params:`, ...);
- every cheap shape (`SMALL`: at most 2^16 elements and flops, well under a millisecond of
  oracle anywhere) once per element width, whatever its label: small hand-picked shapes such
  as MoE's `preset:tiny` (top_k 2 and 4: only 4 makes a scatter-add's order show) are there
  for what their dims cross, and cost nothing to keep;
- every violating case (they never launch: a contract refusal costs nothing).

A feature that only a model-sized preset case carries is still covered, by the smallest such
case. The choice is greedy in ascending cost (an op's input and output elements plus its flops,
ties by the case's fields but its seed), so it is the same in every process, and impls of one
op mostly pick the same cases: their oracle entries are shared.

The real-model shapes that `commit` leaves out (every `preset:` case whose features a smaller
case already covers), long pipelines, seed sweeps and hypothesis' nightly profile are `nightly`'s
share. `tier_features` is what `kparity ops --coverage` counts and what the test that no
(impl, dtype, distribution) is nightly-only checks.
"""

from __future__ import annotations

import functools

import numpy as np

TIERS = ("commit", "nightly")
DEFAULT_TIER = "commit"
SMALL = 1 << 16  # a case this cheap (elements + flops) is kept for its shape alone


def check_tier(tier: str) -> str:
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: one of {', '.join(TIERS)} (default {DEFAULT_TIER})")
    return tier


@functools.lru_cache(maxsize=None)
def case_cost(case) -> int:
    """Elements read and written plus flops: the oracle's and the launch's work, roughly."""
    spec = case.spec
    elements = sum(int(np.prod(t.shape_of(case), dtype=np.int64))
                   for t in spec.inputs + spec.outputs)
    return elements + int(spec.flops(case))


def _width(dtype: str) -> str:
    return "4-byte" if dtype == "f32" else "narrow"


def case_features(case) -> set[tuple]:
    """What a case shows that commit must keep (module docstring)."""
    kind = case.label.split(":", 1)[0]
    out = {("dtype x dist", case.dtype, case.dist)}
    out |= {("param", case.dtype, name, repr(value)) for name, value in case.param_items}
    if case_cost(case) <= SMALL:
        out.add(("shape", case.dim_items, _width(case.dtype)))
    if kind.startswith("edge"):
        out.add(("edge", kind, case.dim_items, _width(case.dtype)))
    elif kind and kind != "preset":
        out.add(("label", case.label))
    return out


def commit_subset(cases: list) -> list:
    """The smallest cases covering every feature of `cases` (greedy by cost), in the given
    order."""
    covered: set[tuple] = set()
    keep: set[str] = set()
    for case in sorted(cases, key=_order):
        new = case_features(case) - covered
        if new:
            covered |= new
            keep.add(case.id)
    return [c for c in cases if c.id in keep]


def _order(case) -> tuple:
    """Cheapest first; ties by what defines the case except its seed, so `--seed N` keeps the
    same cases (re-seeded), not another cover that its new ids would sort into."""
    return (case_cost(case), case.op, case.dim_items, case.dtype, case.dist,
            repr(case.param_items), case.dtype_items, case.label)


def tier_features(cases: list) -> set[tuple]:
    return set().union(*(case_features(c) for c in cases)) if cases else set()
