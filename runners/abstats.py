"""Statistics for timings: per-run summaries and the A/B verdict (`docs/ab.md`).

The unit of replication is the *run* (one full measurement: fresh buffers, fresh graph, its own
stopping rule), not the sample. Samples inside a run are correlated (placement, clocks, TLB), so
a test on samples calls two runs of identical code "different" (p = 3e-149 in our A/A probe:
Mann-Whitney on two `do_bench` runs of one Triton RMSNorm, 4.95 % apart, H200, 2026-11-22).
An A/B therefore reduces each run to its median and works on run medians only:

    ratio = median(run medians of B) / median(run medians of A)       (time ratio; < 1: B faster)
    CI    = 2.5 % and 97.5 % percentiles of that ratio over `n_boot` bootstrap resamples,
            each arm's runs resampled with replacement, independently
    noise = MAD of the A/A log-ratios log(m[i+1] / m[i]) between consecutive runs of the same
            arm (both arms pooled): the run-to-run noise of this benchmark, measured in the A/B
    delta = max(2 %, 3 * noise)

Verdict, B against A: FASTER (or SLOWER) when the CI excludes 1 and |ratio - 1| >= delta; SAME
when the whole CI lies within [1 - delta, 1 + delta]; otherwise AMBIGUOUS (more runs, or a
quieter mode, would decide it).
"""

from __future__ import annotations

import numpy as np

MIN_DELTA = 0.02
NOISE_FACTOR = 3.0


def summarize(samples_s) -> dict:
    """Median, mean, min, quartiles, relative IQR and relative stdev of per-call times (s).
    One sample has no spread to measure: its rel_std is None, not 0 (a "noise 0.00 %" on one
    sample would read as a perfect measurement)."""
    x = np.asarray(samples_s, dtype=np.float64)
    if x.size == 0:
        return {k: None for k in ("median", "mean", "min", "q1", "q3", "rel_iqr", "rel_std")}
    q1, median, q3 = np.percentile(x, [25, 50, 75])
    std = float(x.std(ddof=1)) if x.size > 1 else None
    return {"median": float(median), "mean": float(x.mean()), "min": float(x.min()),
            "q1": float(q1), "q3": float(q3),
            "rel_iqr": float((q3 - q1) / median) if median > 0 else None,
            "rel_std": std / float(x.mean()) if std is not None and x.mean() > 0 else None}


def aa_noise(*arms) -> float:
    """MAD of the log-ratios between consecutive run medians of each arm, pooled."""
    ratios = np.concatenate([np.diff(np.log(np.asarray(a, dtype=np.float64)))
                             for a in arms if len(a) >= 2] or [np.zeros(0)])
    if ratios.size == 0:
        return 0.0
    return float(np.median(np.abs(ratios - np.median(ratios))))


def bootstrap_ratio(a_runs, b_runs, n_boot: int = 4000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float, float]:
    """(ratio, ci_lo, ci_hi) of median(b)/median(a), bootstrapping runs within each arm."""
    a = np.asarray(a_runs, dtype=np.float64)
    b = np.asarray(b_runs, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("bootstrap_ratio needs at least one run per arm")
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(mb / ma, [tail, 100 - tail])
    return float(np.median(b) / np.median(a)), float(lo), float(hi)


def threshold(noise: float) -> float:
    return max(MIN_DELTA, NOISE_FACTOR * noise)


def verdict(ratio: float, lo: float, hi: float, delta: float) -> str:
    """B against A, from the time ratio B/A and its interval."""
    excludes_one = hi < 1.0 or lo > 1.0
    if excludes_one and abs(ratio - 1.0) >= delta:
        return "FASTER" if ratio < 1.0 else "SLOWER"
    if 1.0 - delta <= lo and hi <= 1.0 + delta:
        return "SAME"
    return "AMBIGUOUS"


def compare_runs(a_runs, b_runs, seed: int = 0) -> dict:
    """Everything an A/B row needs from the two arms' run medians."""
    noise = aa_noise(a_runs, b_runs)
    delta = threshold(noise)
    ratio, lo, hi = bootstrap_ratio(a_runs, b_runs, seed=seed)
    return {"ratio": ratio, "ci_lo": lo, "ci_hi": hi, "aa_noise": noise, "delta": delta,
            "verdict": verdict(ratio, lo, hi, delta)}
