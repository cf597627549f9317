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
| max_ulp         | max ULP distance between out and ref in the output dtype             |
| frac_within     | fraction of elements with |out - exact| <= bound                      |
| nonfinite_mismatch | elements where out and ref differ in NaN-ness or in ±inf           |
| budget          | max |out - exact| / bound: the share of the tolerance used (>1 fails) |
| worst_index     | flat index of the element with the largest budget                    |

NaN in the output where the oracle is finite is a mismatch: with outputs poisoned to NaN before
the launch, that is how an unwritten element shows.
"""

from __future__ import annotations

import numpy as np

from oracle.dtypes import tiny, ulp_distance


def compare(out: np.ndarray, ref: np.ndarray, exact: np.ndarray, bound: np.ndarray,
            dtype: str) -> dict:
    o = np.asarray(out).astype(np.float64).ravel()
    r = np.asarray(ref).astype(np.float64).ravel()
    e = np.broadcast_to(np.asarray(exact, dtype=np.float64), np.shape(ref)).ravel()
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), np.shape(ref)).ravel()
    if o.shape != r.shape:
        raise ValueError(f"output has {o.size} elements, oracle has {r.size}")

    nan_o, nan_r = np.isnan(o), np.isnan(r)
    inf_o, inf_r = np.isinf(o), np.isinf(r)
    nonfinite_mismatch = (nan_o != nan_r) | (inf_o != inf_r) | (inf_o & inf_r & (o != r))
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
        "worst_out": float(o[worst]) if o.size else 0.0,
        "worst_exact": float(e[worst]) if e.size else 0.0,
        "worst_bound": float(b[worst]) if b.size else 0.0,
    }
