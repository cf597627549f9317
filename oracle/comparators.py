"""Comparators: how one output of one check is judged against the oracle.

Each output's `TensorSpec.comparator` names its comparator (None: `Bounded()`; `logits=True` is
shorthand for `Logits()`). `runners/correctness.check` hands it an `OutputCheck` and keeps the
`Verdict`: the metrics go to the row's `outputs_json`, a verdict that is not ok fails the row
with its message and names the failure kind in `kparity check`'s summary, its flags go to the
row's `flags` as `<flag>:<output>`. A comparator class may add report-only columns to that
summary (`Summary`). Every verdict's metrics hold `budget`, the share of the tolerance used
(> 1 fails; inf where a zero tolerance is broken): the row keeps the worst output's metrics.

* `Bounded()`: floating-point outputs: |out - exact| <= bound per element, NaN/Inf where the
  oracle has them (`metrics.compare`). The default.
* `Logits()`: a vector of logits: Bounded, and an argmax flip only at a near-tie
  (`metrics.logit_metrics`).
* `Exact()`: ids, counts, permutations: bit-identical to the oracle's.
* `TopKSet(scores)`: top-k ids per row (MoE routing): the row's id set is a top-k of some
  scores within their bounds; a swap at a near-tie is recorded, not failed.
* `Gathered(ids, values)`: values at the ids the impl chose (a router's weights): the inner
  comparator against the oracle's values at those ids.
* `Permuted(key, inner)`: positions in an implementation-defined order (tokens grouped by
  expert): the inner comparator after both sides are sorted by `key`.

The op's `bounds` gives each output's bound; an `Exact` output ignores it, a `TopKSet` or
`Gathered` output reads it as the bound of the oracle entry it names (shaped like that entry).
The oracle may return entries beyond its outputs (e.g. a router's probabilities over every
expert): comparators read them, the store never sees them.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from oracle.dtypes import round_to
from oracle.metrics import budget_text, compare, level2_metrics, logit_metrics


@dataclass(frozen=True)
class OutputCheck:
    """One output of one check: what a comparator judges. `out`, `ref` and `exact` have the
    output's shape; `bound` broadcasts to it (to the named entry, for `TopKSet`, `Gathered`)."""

    name: str
    out: np.ndarray              # the impl's, in the storage dtype
    ref: np.ndarray              # the oracle's, rounded to the storage dtype
    exact: np.ndarray            # the oracle's float64 pre-store value
    bound: np.ndarray            # on |out - exact|, from `OpSpec.bounds`
    dtype: str
    case: object
    inf_may_be_nan: bool = False          # `OpSpec.inf_may_be_nan`
    level2: np.ndarray | None = None      # `OpSpec.loss`'s reference: reported, never gated
    outputs: Mapping[str, np.ndarray] = field(default_factory=dict)  # every impl output
    refs: Mapping[str, np.ndarray] = field(default_factory=dict)     # every oracle output, rounded
    exacts: Mapping[str, np.ndarray] = field(default_factory=dict)   # all the oracle returned


@dataclass(frozen=True)
class Verdict:
    metrics: dict                  # JSON-ready, with `budget`; stored in `outputs_json`
    ok: bool
    message: str = ""              # why not ok, naming the output and where
    kind: str = ""                 # the failure kind `kparity check` counts ("over bound", ...)
    flags: tuple[str, ...] = ()    # row flags, without the output name ("near_tie")


@dataclass(frozen=True)
class Summary:
    """One section of the report-only table after `kparity check`'s summary: fed, per impl,
    by the metrics of every output that hold `key`; `cells` turns them into the columns."""

    title: str
    key: str
    columns: tuple[str, ...]
    cells: Callable[[list[dict]], tuple[str, ...]]


SUMMARIES: list[Summary] = []  # in the order their columns are printed


def add_summary(section: Summary) -> Summary:
    SUMMARIES.append(section)
    return section


class Comparator:
    """Subclasses implement `judge`; `summary` names their report-only columns, if any."""

    summary: Summary | None = None

    def judge(self, x: OutputCheck) -> Verdict:
        raise NotImplementedError

    def __call__(self, x: OutputCheck) -> Verdict:
        verdict = self.judge(x)
        if x.level2 is None:
            return verdict
        return dataclasses.replace(verdict, metrics={  # level 2: reported, never gated
            **verdict.metrics, "level2": level2_metrics(x.out, x.level2)})

    def describe(self, m: dict) -> str:
        """The metrics in one line, for `kparity repro`."""
        return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in sorted(m.items()) if isinstance(v, (int, float, bool)))


# --- the element-wise bound and the logit gate ---------------------------------------------------

NONFINITE_FREE = ":nonfinite_free"  # the suffix of an oracle's mask (`Bounded`)


@dataclass(frozen=True)
class Bounded(Comparator):
    """|out - exact| <= bound element-wise, NaN/Inf where the oracle has them (`metrics.compare`,
    `OpSpec.inf_may_be_nan`). An oracle may return, beside output `name`, a boolean mask
    `name + NONFINITE_FREE`: where it is set and the oracle's value is NaN or ±inf, any NaN or
    ±inf output is admitted (the contract leaves the sign open: `oracle/rope.py`)."""

    def judge(self, x: OutputCheck) -> Verdict:
        m = compare(x.out, x.ref, x.exact, x.bound, x.dtype, x.inf_may_be_nan,
                    x.exacts.get(x.name + NONFINITE_FREE))
        if m["budget"] <= 1.0 and m["nonfinite_mismatch"] == 0:
            return Verdict(m, True)
        message = (f"{x.name}[{m['worst_index']}] = {m['worst_out']:.9g}, oracle "
                   f"{m['worst_exact']:.9g}, bound {m['worst_bound']:.3g} (budget "
                   f"{budget_text(m['budget'])}, {m['nonfinite_mismatch']} NaN/Inf mismatches)")
        kind = "NaN/Inf mismatch" if m["nonfinite_mismatch"] else "over bound"
        return Verdict(m, False, message, kind)

    def describe(self, m: dict) -> str:
        ulp = m.get("worst_ulp")  # at the worst element; absent from rows stored before it
        return (f"budget {budget_text(m['budget'])}, max_abs {m['max_abs']:.3g}, ulp at worst "
                f"{'-' if ulp is None else ulp}, frac_within {m['frac_within']:.6f}, "
                f"NaN/Inf mismatches {m['nonfinite_mismatch']}, worst index {m['worst_index']}")


def _logit_cells(ms: list[dict]) -> tuple[str, ...]:
    return (str(len(ms)), str(sum(m["argmax_match"] for m in ms)),
            str(sum(m["near_tie"] for m in ms)),
            f"{min(m['top5_overlap'] for m in ms):.2f}" if ms else "-")


@dataclass(frozen=True)
class Logits(Bounded):
    """A vector of logits: `Bounded`, plus argmax agreement, the oracle's top-1 / top-2 margin and
    top-5 overlap (`metrics.logit_metrics`). The impl's argmax j may differ from the oracle's i
    where exact[i] - exact[j] <= bound[i] + bound[j]: a near-tie, flagged `near_tie`, not failed."""

    summary = add_summary(Summary("logit agreement", "argmax_match",
                                  ("logit outputs", "argmax match", "near-ties", "min top-5"),
                                  _logit_cells))

    def judge(self, x: OutputCheck) -> Verdict:
        bounded = super().judge(x)
        m = {**bounded.metrics, **logit_metrics(x.out, x.exact, x.bound)}
        flags = ("near_tie",) if m.get("near_tie") else ()
        if not m.get("argmax_fail"):
            return dataclasses.replace(bounded, metrics=m, flags=flags)
        flip = (f"{x.name}: argmax {m['argmax']}, oracle's {m['argmax_oracle']}: the oracle's "
                f"gap {m['flip_gap']:.3g} exceeds the tolerance's {m['flip_allowed']:.3g}")
        return Verdict(m, False, "; ".join(filter(None, (bounded.message, flip))),
                       "NaN/Inf mismatch" if m["nonfinite_mismatch"] else "argmax flip", flags)


# --- exact outputs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Exact(Comparator):
    """Bit-identical to the oracle's (ids, counts, permutations): `mismatches` counts the
    elements that differ, `first_mismatch` is the first one's flat index (-1: none); budget 0,
    or inf (the tolerance is zero)."""

    def judge(self, x: OutputCheck) -> Verdict:
        out, ref = np.asarray(x.out), np.asarray(x.ref)
        if out.size != ref.size:
            raise ValueError(f"output has {out.size} elements, oracle has {ref.size}")
        differ = np.flatnonzero(_bits(out) != _bits(ref.astype(out.dtype)))
        first = int(differ[0]) if differ.size else -1
        m = {"mismatches": int(differ.size), "first_mismatch": first,
             "budget": float("inf") if differ.size else 0.0}
        if not differ.size:
            return Verdict(m, True)
        at = tuple(int(i) for i in np.unravel_index(first, ref.shape))
        return Verdict(m, False, kind="exact mismatch", message=(
            f"{x.name}: {differ.size} of {ref.size} elements differ from the oracle's; the first, "
            f"[{first}] {at}, is {out.ravel()[first]} where the oracle has {ref.ravel()[first]}"))


def _bits(a: np.ndarray) -> np.ndarray:
    """The elements' bit patterns: NaN equals NaN with the same payload, -0 differs from +0."""
    a = np.ascontiguousarray(a).ravel()
    return a.view(f"u{a.dtype.itemsize}")


# --- top-k sets ----------------------------------------------------------------------------------

def _topk_cells(ms: list[dict]) -> tuple[str, ...]:
    return (str(len(ms)), str(sum(m["tie_rows"] for m in ms)),
            str(sum(m["near_tie_rows"] for m in ms)))


@dataclass(frozen=True)
class TopKSet(Comparator):
    """Top-k ids per row (the last axis holds a row's k ids, in any order), chosen on the scores
    of the oracle entry `scores` (shape [..., n]: every candidate's score), whose bound the op
    returns as this output's.

    With s a row's exact scores, b their bounds and S the impl's k ids: a kernel whose scores
    s~ have |s~ - s| <= b can pick S iff no score it left can be forced above one it picked,
    i.e. s_i - b_i <= s_j + b_j for every j in S, i not in S. The row's budget is

        max over j in S, i not in S, s_i > s_j of (s_i - s_j) / (b_i + b_j)

    (0 when S is the oracle's own set). A row whose set differs from the oracle's within budget 1
    is a near-tie: recorded (`near_tie_rows`, flag `near_tie`), not failed; beyond it, or with ids
    out of range or repeated, the row fails. `tie_rows` counts the rows where the oracle's k-th
    and (k+1)-th scores are within their bounds (a swap there would pass). Rows whose scores
    hold a NaN have no order: they are not judged."""

    scores: str
    summary = add_summary(Summary("top-k agreement", "near_tie_rows",
                                  ("top-k outputs", "tie rows", "rows swapped at near-ties"),
                                  _topk_cells))

    def judge(self, x: OutputCheck) -> Verdict:
        k, lead = x.out.shape[-1], x.out.shape[:-1]
        ids = np.asarray(x.out).astype(np.int64).reshape(-1, k)
        oracle = np.sort(np.asarray(x.ref).astype(np.int64).reshape(-1, k), axis=1)
        s = np.asarray(x.exacts[self.scores], dtype=np.float64)
        n = s.shape[-1]
        b = np.broadcast_to(np.asarray(x.bound, dtype=np.float64), s.shape).reshape(-1, n)
        s = s.reshape(-1, n)
        judged = ~np.isnan(s).any(axis=1)
        mine = np.sort(ids, axis=1)
        invalid = judged & (((ids < 0) | (ids >= n)).any(axis=1)
                            | (np.diff(mine, axis=1) == 0).any(axis=1))
        swapped = judged & ~invalid & (mine != oracle).any(axis=1)
        rows = np.flatnonzero(swapped)
        ratio, pair = _swap_ratios(s[rows], b[rows], ids[rows])
        budget = np.zeros(len(ids))
        budget[rows] = ratio
        budget[invalid] = np.inf
        failed = np.flatnonzero(budget > 1.0)
        near = np.flatnonzero(swapped & (budget <= 1.0))
        m = {"rows": len(ids), "k": k, "budget": float(budget.max(initial=0.0)),
             "tie_rows": _tie_rows(s[judged], b[judged], k),
             "near_tie_rows": int(near.size), "near_tie": bool(near.size),
             "near_tie_at": near[:8].tolist(), "failed_rows": int(failed.size),
             "first_failed_row": int(failed[0]) if failed.size else -1}
        flags = ("near_tie",) if near.size else ()
        if not failed.size:
            return Verdict(m, True, flags=flags)
        r = int(failed[0])
        where = f"{x.name}: row {_row_name(r, lead)}"
        if invalid[r]:
            why = f"ids {ids[r].tolist()} are not {k} distinct candidates in [0, {n})"
        else:
            j, i = pair[int(np.searchsorted(rows, r))]
            gap, allowed = s[r, i] - s[r, j], b[r, i] + b[r, j]
            why = (f"picked {j} over {i} (the oracle's top-{k}: {oracle[r].tolist()}, the "
                   f"impl's: {mine[r].tolist()}): the oracle's scores {s[r, i]:.9g} and "
                   f"{s[r, j]:.9g} differ by {gap:.3g}, more than their bounds allow "
                   f"({allowed:.3g})")
        return Verdict(m, False, f"{where}: {why}; {failed.size} of {len(ids)} rows fail",
                       "top-k set mismatch", flags)


def _swap_ratios(s: np.ndarray, b: np.ndarray, ids: np.ndarray
                 ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Per row (scores s, bounds b, picked ids): the budget of the docstring's formula and the
    pair (picked j, left i) that sets it."""
    if not len(ids):
        return np.zeros(0), []
    picked = np.zeros(s.shape, dtype=bool)
    np.put_along_axis(picked, ids, True, axis=1)
    s_j, b_j = np.take_along_axis(s, ids, 1)[:, :, None], np.take_along_axis(b, ids, 1)[:, :, None]
    with np.errstate(invalid="ignore", divide="ignore"):  # inf - inf: equal scores, no gap
        gap = s[:, None, :] - s_j
        ratio = np.where((gap > 0) & ~picked[:, None, :], gap / (b[:, None, :] + b_j), 0.0)
    flat = ratio.reshape(len(ids), -1).argmax(axis=1)
    j, i = np.unravel_index(flat, ratio.shape[1:])
    return (ratio.reshape(len(ids), -1).max(axis=1),
            [(int(ids[r, j[r]]), int(i[r])) for r in range(len(ids))])


def _tie_rows(s: np.ndarray, b: np.ndarray, k: int) -> int:
    """Rows whose oracle k-th and (k+1)-th scores are within their bounds of each other."""
    if k >= s.shape[1] or not len(s):
        return 0
    order = np.argsort(-s, axis=1, kind="stable")[:, k - 1:k + 1]
    top, b_top = np.take_along_axis(s, order, 1), np.take_along_axis(b, order, 1)
    # an overflow to inf compares as it should: an infinite gap is no tie, an infinite bound is
    with np.errstate(invalid="ignore", over="ignore"):
        return int(np.sum(~(top[:, 0] - top[:, 1] > b_top[:, 0] + b_top[:, 1])))


def _row_name(r: int, lead: tuple[int, ...]) -> str:
    if len(lead) <= 1:
        return str(r)
    return str(tuple(int(i) for i in np.unravel_index(r, lead)))


# --- outputs read through another output ---------------------------------------------------------

@dataclass(frozen=True)
class Gathered(Comparator):
    """Values the impl reports for the candidates it chose: out[..., r] is judged by `inner`
    against the oracle's `values[..., ids[..., r]]`, where `values` is an oracle entry over every
    candidate (e.g. a router's probabilities) and `ids` the impl's own ids output. Where a
    near-tie lets the impl pick another candidate than the oracle (`TopKSet`), its value is
    checked at its own pick. The op returns the bound of the whole `values` entry as this
    output's. Ids out of range are clipped here: the ids' own comparator fails them."""

    ids: str
    values: str
    inner: Comparator = Bounded()

    def judge(self, x: OutputCheck) -> Verdict:
        full = np.asarray(x.exacts[self.values], dtype=np.float64)
        ids = np.clip(np.asarray(x.outputs[self.ids]).astype(np.int64), 0, full.shape[-1] - 1)
        bound = np.broadcast_to(np.asarray(x.bound, dtype=np.float64), full.shape)
        exact = np.take_along_axis(full, ids, -1)
        return self.inner.judge(dataclasses.replace(
            x, exact=exact, ref=round_to(exact, x.dtype),
            bound=np.take_along_axis(bound, ids, -1)))

    def describe(self, m: dict) -> str:
        return self.inner.describe(m)


@dataclass(frozen=True)
class Permuted(Comparator):
    """Positions whose order is implementation-defined (tokens grouped by expert with ties in
    any order; top-k slots unsorted): both sides are put in one canonical order, then judged by
    `inner`. The order sorts lexicographically by the `key` outputs (first key first), the
    impl's positions by the impl's keys and the oracle's by the oracle's, along `axis` 0 (rows:
    a key's row read as a tuple) or -1 (within each row: keys shaped like the output). The key
    must identify every position (else the order is still undefined, and the check raises): key
    on the output itself where it is exact (ids). The keys are judged by their own comparators;
    `inner` sees this output permuted and its siblings as they are (a level-2 reference too:
    give a permuted output none)."""

    key: tuple[str, ...]
    inner: Comparator = Bounded()
    axis: int = 0

    def __post_init__(self):
        if isinstance(self.key, str):
            object.__setattr__(self, "key", (self.key,))
        if self.axis not in (0, -1):
            raise ValueError(f"Permuted: axis {self.axis}: 0 (rows) or -1 (within rows)")

    def judge(self, x: OutputCheck) -> Verdict:
        mine = self._order([x.outputs[k] for k in self.key])
        theirs = self._order([x.refs[k] for k in self.key], check_unique=x.name)
        bound = np.broadcast_to(np.asarray(x.bound, dtype=np.float64), np.shape(x.ref))
        verdict = self.inner.judge(dataclasses.replace(
            x, out=self._take(x.out, mine), ref=self._take(x.ref, theirs),
            exact=self._take(np.broadcast_to(x.exact, np.shape(x.ref)), theirs),
            bound=self._take(bound, theirs)))
        if verdict.ok:
            return verdict
        return dataclasses.replace(verdict, message=(
            f"{verdict.message} (positions sorted by {', '.join(self.key)})"))

    def describe(self, m: dict) -> str:
        return self.inner.describe(m)

    def _order(self, keys: list[np.ndarray], check_unique: str = "") -> np.ndarray:
        if self.axis == 0:
            cols = [c for k in keys for c in np.asarray(k).reshape(len(k), -1).T]
            order = np.lexsort(cols[::-1])
            sorted_keys = np.stack([c[order] for c in cols])
            repeats = np.flatnonzero((np.diff(sorted_keys, axis=1) == 0).all(axis=0))
        else:
            order = np.lexsort([np.asarray(k) for k in keys][::-1], axis=-1)
            sorted_keys = np.stack([np.take_along_axis(np.asarray(k), order, -1) for k in keys])
            repeats = np.flatnonzero((np.diff(sorted_keys, axis=-1) == 0).all(axis=0))
        if check_unique and repeats.size:
            raise ValueError(f"{check_unique}: the key ({', '.join(self.key)}) repeats in the "
                             f"oracle's output ({repeats.size} times): add keys until they "
                             f"identify every position")
        return order

    def _take(self, a, order: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        return a[order] if self.axis == 0 else np.take_along_axis(a, order, -1)


# --- the level-2 loss: any comparator reports it -------------------------------------------------

def _level2_cells(ms: list[dict]) -> tuple[str, ...]:
    l2 = [m["level2"] for m in ms]
    return (str(len(l2)), f"{statistics.median(m['rel_rms'] for m in l2):.3g}" if l2 else "-",
            f"{min(m['cosine'] for m in l2):.4f}" if l2 else "-")


LEVEL2 = add_summary(Summary("level-2 quantization loss", "level2",
                             ("level-2 cases", "median rel RMS", "min cosine"), _level2_cells))


# --- what the runner and the CLI call ------------------------------------------------------------

def comparator_for(tensor) -> Comparator:
    """The comparator of an output `TensorSpec`."""
    if tensor.comparator is not None:
        return tensor.comparator
    return Logits() if tensor.logits else Bounded()


def judge_outputs(spec, case, inputs: dict, out: dict, exact: dict, ref: dict,
                  bounds: dict) -> dict[str, Verdict]:
    """Every output's verdict, in the op's output order."""
    level2 = (spec.loss(inputs, case) if spec.loss is not None else None) or {}
    return {t.name: comparator_for(t)(OutputCheck(
        t.name, out[t.name], ref[t.name], exact[t.name], bounds[t.name], t.dtype(case),
        case, spec.inf_may_be_nan, level2.get(t.name), out, ref, exact)) for t in spec.outputs}


def describe(spec, name: str, metrics: dict) -> str:
    """One output's stored metrics in one line, as its comparator words them. A staged
    pipeline impl's row also holds its stages' outputs, named "<stage>.<output>"."""
    tensor = next((t for t in spec.outputs if t.name == name), None)
    if tensor is None and spec.pipeline is not None and "." in name:
        stage, output = name.split(".", 1)
        return describe(next(s for s in spec.pipeline.stages if s.name == stage).spec, output,
                        metrics)
    if tensor is None:
        raise KeyError(f"op {spec.name} has no output {name!r}")
    return comparator_for(tensor).describe(metrics)
