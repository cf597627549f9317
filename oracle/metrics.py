"""Error metrics of one output against the oracle.

`ref` is the oracle rounded to the output dtype (what a perfect kernel stores), `exact` the
float64 pre-store value, `bound` the op's element-wise tolerance on |out - exact|.

| metric          | definition                                                           |
|-----------------|----------------------------------------------------------------------|
| max_abs         | max |out - ref|                                                       |
| max_rel         | max |out - ref| / max(|ref|, floor), floor = 1e-3 · rms(ref) or the   |
|                 | dtype's smallest normal, whichever is larger                         |
| nmse            | Σ(out - ref)² / Σ ref²  (0 when both are all zero)                    |
| cosine          | <out, ref> / (|out| |ref|), 1 when both are all zero                  |
| max_ulp         | max ULP distance between out and ref in the output dtype, over the   |
|                 | elements where both are finite (huge where outputs cross zero: kept  |
|                 | for queries, not shown in summaries)                                 |
| frac_within     | fraction of elements with |out - exact| <= bound                      |
| nonfinite_mismatch | elements where out and ref differ in NaN-ness or in ±inf           |
| budget          | max |out - exact| / bound: the share of the tolerance used (>1 fails) |
| worst_index     | flat index of the element with the largest budget                    |
| worst_ulp       | ULP distance between out and ref at that element; None where either  |
|                 | is NaN/Inf there (the summaries' ULP column: it describes the element |
|                 | the budget describes, so a near-zero output's huge count never shows |
|                 | beside a small budget)                                               |

NaN in the output where the oracle is finite is a mismatch: with outputs poisoned to NaN before
the launch, that is how an unwritten element shows.

Logit outputs (the `Logits()` comparator, `oracle/comparators.py`) also get `logit_metrics`:
argmax agreement, the oracle's top-1 / top-2 margin and top-5 overlap. The impl's argmax j may
differ from the oracle's i legitimately when exact[i] - exact[j] <= bound[i] + bound[j] (both
moved within their tolerance): a near-tie, recorded, not failed. Beyond that the flip fails.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import tiny, ulp_distance


def compare(out: np.ndarray, ref: np.ndarray, exact: np.ndarray, bound: np.ndarray,
            dtype: str, inf_may_be_nan: bool = False, nonfinite_free=None) -> dict:
    """The metrics of the table above. `inf_may_be_nan` (`OpSpec.inf_may_be_nan`): an output
    NaN where the oracle has ±inf is no mismatch. `nonfinite_free` (a mask, broadcast to the
    output; `comparators.Bounded`): where the contract leaves which nonfinite value open (an
    infinity times a factor whose sign the kernel's rounding may flip), any NaN or ±inf is no
    mismatch; a finite output there still is."""
    o = np.asarray(out).astype(np.float64).ravel()
    r = np.asarray(ref).astype(np.float64).ravel()
    e = np.broadcast_to(np.asarray(exact, dtype=np.float64), np.shape(ref)).ravel()
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), np.shape(ref)).ravel()
    if o.shape != r.shape:
        raise ValueError(f"output has {o.size} elements, oracle has {r.size}")

    nan_o, nan_r = np.isnan(o), np.isnan(r)
    inf_o, inf_r = np.isinf(o), np.isinf(r)
    nonfinite_mismatch = (nan_o != nan_r) | (inf_o != inf_r) | (inf_o & inf_r & (o != r))
    if inf_may_be_nan:
        nonfinite_mismatch &= ~(nan_o & inf_r)
    if nonfinite_free is not None:
        free = np.broadcast_to(np.asarray(nonfinite_free, dtype=bool), np.shape(ref)).ravel()
        nonfinite_mismatch &= ~(free & ~np.isfinite(o) & ~np.isfinite(r))
    finite = np.isfinite(o) & np.isfinite(r)

    with np.errstate(divide="ignore", invalid="ignore"):  # inf - inf where both are inf
        diff = np.where(finite, np.abs(o - r), 0.0)
        err = np.where(finite, np.abs(o - e), 0.0)
        ratio = np.where(err == 0, 0.0, err / b)
    ratio = np.where(nonfinite_mismatch, np.inf, ratio)

    rf = r[finite]
    floor = max(tiny(dtype) if dtype in ("f32", "f16", "bf16") else 0.0,
                1e-3 * float(np.sqrt(np.mean(rf * rf))) if rf.size else 0.0)
    den_o = float(np.sqrt(np.sum(o[finite] ** 2)))
    den_r = float(np.sqrt(np.sum(rf ** 2)))
    if den_o == 0 and den_r == 0:
        cosine = 1.0
    elif den_o == 0 or den_r == 0:
        cosine = 0.0
    else:
        cosine = float(np.dot(o[finite], rf) / (den_o * den_r))
    sum_r2 = float(np.sum(rf ** 2))
    sum_d2 = float(np.sum(diff ** 2))
    nmse = 0.0 if sum_d2 == 0 else (sum_d2 / sum_r2 if sum_r2 > 0 else float("inf"))
    ulps = ulp_distance(np.where(finite, o, 0.0), np.where(finite, r, 0.0), dtype) \
        if dtype in ("f32", "f16", "bf16") else np.zeros(1)

    worst = int(np.argmax(ratio)) if ratio.size else 0
    worst_ulp = int(ulps[worst]) if ulps.size == o.size and o.size and finite[worst] else None
    return {
        "max_abs": float(diff.max(initial=0.0)),
        "max_rel": float((diff / np.maximum(np.abs(r), floor)).max(initial=0.0)) if floor > 0
        else float(diff.max(initial=0.0)),
        "nmse": nmse,
        "cosine": cosine,
        "max_ulp": int(ulps.max(initial=0)),
        "frac_within": float(np.mean(ratio <= 1.0)) if ratio.size else 1.0,
        "nonfinite_mismatch": int(nonfinite_mismatch.sum()),
        "budget": float(ratio.max(initial=0.0)),
        "worst_index": worst,
        "worst_ulp": worst_ulp,
        "worst_out": float(o[worst]) if o.size else 0.0,
        "worst_exact": float(e[worst]) if e.size else 0.0,
        "worst_bound": float(b[worst]) if b.size else 0.0,
    }


TOP_K = 5


def logit_metrics(out: np.ndarray, exact: np.ndarray, bound: np.ndarray) -> dict:
    """Argmax agreement on a logit vector: see the module docstring. Logits whose oracle holds
    a NaN (NaN inputs, the `nonfinite` distribution) have no argmax: nothing is recorded, and
    the NaN/Inf rule of `compare` alone judges them."""
    o = np.asarray(out).astype(np.float64).ravel()
    e = np.asarray(exact, dtype=np.float64).ravel()
    if np.isnan(e).any():
        return {}
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), e.shape)
    i, j = int(np.argmax(e)), int(np.nanargmax(o)) if np.isfinite(o).any() else -1
    top = np.argsort(-e, kind="stable")[:TOP_K]
    mine = np.argsort(-np.where(np.isnan(o), -np.inf, o), kind="stable")[:TOP_K]
    flip = j != i
    allowed = float(b[i] + b[j]) if j >= 0 else 0.0
    gap = float(e[i] - e[j]) if j >= 0 else float("inf")  # the oracle's gap to the impl's pick
    return {
        "argmax": j, "argmax_oracle": i, "argmax_match": not flip,
        "margin": float(e[top[0]] - e[top[1]]) if e.size > 1 else float("inf"),
        "top5_overlap": len(set(top.tolist()) & set(mine.tolist())) / min(TOP_K, e.size),
        "near_tie": bool(flip and gap <= allowed),
        "argmax_fail": bool(flip and gap > allowed),
        "flip_gap": gap if flip else 0.0, "flip_allowed": allowed if flip else 0.0,
    }


def level2_metrics(out: np.ndarray, reference: np.ndarray) -> dict:
    """Distance to a level-2 reference (e.g. the unquantized weights' product): relative RMS
    error, cosine and max relative error; reported, never gated."""
    o = np.asarray(out).astype(np.float64).ravel()
    r = np.asarray(reference, dtype=np.float64).ravel()
    rms = float(np.sqrt(np.mean(r * r))) or 1.0
    norm = float(np.linalg.norm(o) * np.linalg.norm(r))
    return {"rel_rms": float(np.sqrt(np.mean((o - r) ** 2))) / rms,
            "cosine": float(o @ r) / norm if norm else float(np.array_equal(o, r)),
            "max_abs_over_rms": float(np.max(np.abs(o - r), initial=0.0)) / rms}


def budget_text(budget: float | None) -> str:
    """A budget as text with 3 significant digits, rounded away from 1 so that the side of 1 is
    never lost: 0.9996 reads 0.999 (rounded down: a pass), 1.0004 reads 1.01 (rounded up: a
    failure), only 1 itself reads 1. "-" for None (nothing judged)."""
    from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

    if budget is None:
        return "-"
    if budget == 0 or not np.isfinite(budget):
        return f"{budget:g}"
    value = Decimal(repr(float(budget)))  # the shortest decimal of the float: no binary noise
    step = Decimal(1).scaleb(value.adjusted() - 2)  # the third significant digit
    rounded = value.quantize(step, rounding=ROUND_FLOOR if value < 1 else ROUND_CEILING)
    if -4 <= rounded.adjusted() < 4:
        return f"{rounded.normalize():f}"
    return f"{float(rounded):.3g}"  # exact: `rounded` has 3 significant digits
