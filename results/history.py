"""Results history: one series per (metric, impl, case, mode, device), and the rules that call a
change in a series a regression (used by `kparity compare --baseline` and the HTML report).

Series. `median_ns` comes from plain `bench` rows (arm "": A/B arms are not history) with status
ok; `budget` (worst error / tolerance, <= 1 passes) from `correctness` rows that carry one
(mode ""), except those of `kparity repro` runs (`runs.verb`): a rerun of a few cases, without
the known-issues ledger, is no point of a sweep's history (its rows stay in the store). A
series holds one point per run, in run order (run ids sort by time); a run with several rows
for one key contributes their median (of q1 and q3 too, for timings).

Detection (`detect`), on a series' per-run values x_0 .. x_{n-1}; lower is better for both
metrics (a slower kernel, or a larger error budget, is a regression):

- lookback z-score (conbench): the baseline of point i is the up-to-`window` points before it
  since its segment started (a reset from an annotation, or a detected step), needing at least
  `min_history` of them; z = (x_i - mean) / std with Bessel's std floored at
  max(rel_floor * |mean|, abs_floor). Flagged when |z| >= z and |x_i / mean - 1| >= min_change.
  The floor matters: error budgets are often bit-identical run after run (std 0), and a timing
  baseline can be quieter than anything worth reporting.
- step (asv's idea, binary segmentation): within each segment between resets, the split that
  minimises the L1 cost sum|x - median| of its two halves (asv's robust cost; the old level
  needs `min_history` points, like a z-score baseline, the new one `min_segment`) is a step
  when its two-sample z passes the same |z| >= z and |level_right / level_left - 1| >=
  min_change; then each half is searched again. The z: each half is winsorised at 3 robust
  sigmas (1.4826 * MAD of the residuals around the two medians) from its median, so one wild
  run can neither make nor hide a step; levels = the winsorised means; z = (level_right -
  level_left) / (sd * sqrt(1/n_left + 1/n_right)), sd = the pooled std of the winsorised halves
  (n - 2 degrees of freedom), floored as above and, inside a half already split off, at its
  parent's sd (a shorter segment estimates the noise worse: without this floor, the 10 runs
  after a real step split again on noise). A step is reported at the first point of the new
  level, though it becomes visible only `min_segment` runs later. Binary segmentation stops
  at the first insignificant split, so a short up-and-back excursion can hide from it (the
  z-score still sees its first point when it is large).

A detected step restarts the z-score baseline (points after it are compared with the new level),
and one detection is kept per index (the step, where both fire).

Defaults: z = 5, min_change = 5 %, min_history = 10, window = 100, rel_floor = 0.5 %,
abs_floor = 0 (0.01 for budgets, `ABS_FLOOR`: a budget moving from 1e-9 to 3e-9 is not a
change), min_segment = 4. min_history is 10, not conbench's 5: x_i against the mean of n points
is a t statistic with n - 1 degrees of freedom, and P(|t_4| > 5) = 0.75 % per point, which made
2.2 false alarms per 100 series of 30 runs of 3 % CV noise (simulated); from 10 points, 0.3.
An 8 % step after run 20 of 30 in 3 % CV noise is found by the step detector (the z-score
alone cannot: one point is only 2.7 sigma off) in 96 % of draws (simulated), at exactly run 20
in 71 % and within one run in 90 %: noise near the edge can look like either level.

Annotations (`kparity accept`): an annotation row for an impl id or a case id (metric "" = every
metric) resets the baseline of each matching series at its run: points before it are no longer
anyone's baseline. The change it accepts is still reported, with `accepted_by` = its reason: each
alert from the start of the level in force at the annotation's run (the last step at or before
it, found without the reset) up to that run.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

import numpy as np

from results.runinfo import started_from_id
from results.store import Store

# metric -> (table, column)
METRICS = {"median_ns": ("bench", "median_ns"), "budget": ("correctness", "budget")}
# Smallest std that counts, per metric, in the metric's own units: budgets are fractions of the
# tolerance, and a change of a hundredth of the tolerance is not worth an alert.
ABS_FLOOR = {"median_ns": 0.0, "budget": 0.01}

Z = 5.0
MIN_CHANGE = 0.05
MIN_HISTORY = 10
WINDOW = 100
REL_FLOOR = 0.005
MIN_SEGMENT = 4
MAD_TO_SIGMA = 1.4826  # MAD of a normal sample -> its sigma
WINSOR = 3.0           # step detector: values clipped at 3 robust sigmas from their side's median


@dataclass(frozen=True)
class Point:
    run_id: str
    started: datetime
    value: float
    lo: float | None = None   # q1 for timings
    hi: float | None = None   # q3 for timings


@dataclass(frozen=True, order=True)
class SeriesKey:
    metric: str      # median_ns | budget
    impl: str
    case_id: str
    mode: str        # "" for budget
    device: str


@dataclass
class Series:
    key: SeriesKey
    op: str
    dtype: str
    label: str
    points: list[Point]


@dataclass(frozen=True)
class Alert:
    key: SeriesKey
    run_id: str
    index: int                  # position in the series' points (of the runs considered)
    kind: str                   # zscore | step
    direction: str              # regression | improvement
    baseline: float             # baseline mean (zscore) or the old level (step)
    value: float                # the point (zscore) or the new level (step)
    change: float               # value / baseline - 1
    z: float
    accepted_by: str | None     # the annotation's reason, when one accepts this change


@dataclass(frozen=True)
class Detection:
    """One flagged index of a series (see `detect`)."""
    index: int
    kind: str
    direction: str
    baseline: float
    value: float
    change: float
    z: float


# --- detection ---------------------------------------------------------------------------------

def _floored(std: float, level: float, rel_floor: float, abs_floor: float) -> float:
    return max(std, rel_floor * abs(level), abs_floor)


def _ratio_change(value: float, baseline: float) -> float:
    if baseline == 0:
        return 0.0 if value == 0 else math.copysign(math.inf, value)
    return value / baseline - 1.0


def _z(diff: float, se: float) -> float:
    if se > 0:
        return diff / se
    return 0.0 if diff == 0 else math.copysign(math.inf, diff)


def _direction(change: float, lower_is_better: bool) -> str:
    return "regression" if (change > 0) == lower_is_better else "improvement"


def zscore(values: Sequence[float], i: int, *, start: int = 0, window: int = WINDOW,
           rel_floor: float = REL_FLOOR,
           abs_floor: float = 0.0) -> tuple[float, float, float, int] | None:
    """(baseline mean, z, change, baseline length) of point i against
    values[max(start, i - window):i], flagged or not; None under 2 baseline points."""
    base = np.asarray(values[max(start, i - window):i], dtype=np.float64)
    if len(base) < 2:
        return None
    mean = float(base.mean())
    std = _floored(float(base.std(ddof=1)), mean, rel_floor, abs_floor)
    x = float(values[i])
    return mean, _z(x - mean, std), _ratio_change(x, mean), len(base)


def lookback(values: Sequence[float], i: int, *, start: int = 0, z: float = Z,
             min_change: float = MIN_CHANGE, lower_is_better: bool = True,
             min_history: int = MIN_HISTORY, window: int = WINDOW, rel_floor: float = REL_FLOOR,
             abs_floor: float = 0.0) -> Detection | None:
    """The lookback z-score detection of point i (module docstring); None when it is not
    flagged or the baseline is shorter than min_history."""
    got = zscore(values, i, start=start, window=window, rel_floor=rel_floor, abs_floor=abs_floor)
    if got is None or got[3] < min_history:
        return None
    mean, score, change, _ = got
    if abs(score) < z or abs(change) < min_change:
        return None
    return Detection(i, "zscore", _direction(change, lower_is_better), mean, float(values[i]),
                     change, score)


def _l1_split(seg: np.ndarray, min_before: int, min_after: int) -> int:
    """The split t (seg[:t] | seg[t:], at least min_before | min_after long) of least L1 cost."""
    def cost(part):
        return float(np.abs(part - np.median(part)).sum())
    splits = range(min_before, len(seg) - min_after + 1)
    return min(splits, key=lambda t: (cost(seg[:t]) + cost(seg[t:]), t))


@dataclass(frozen=True)
class _Split:
    z: float
    change: float
    sd: float
    before: float   # the levels: winsorised means of the two halves
    after: float


def _split_z(left: np.ndarray, right: np.ndarray, *, rel_floor: float, abs_floor: float,
             parent_sd: float) -> _Split:
    """The pooled-variance two-sample z of the halves winsorised at WINSOR robust sigmas around
    each one's median; sd floored as in the module docstring."""
    m_left, m_right = float(np.median(left)), float(np.median(right))
    mad = float(np.median(np.abs(np.concatenate([left - m_left, right - m_right]))))
    bound = WINSOR * MAD_TO_SIGMA * mad
    lw = np.clip(left, m_left - bound, m_left + bound)
    rw = np.clip(right, m_right - bound, m_right + bound)
    before, after = float(lw.mean()), float(rw.mean())
    resid = np.concatenate([lw - before, rw - after])
    sd = _floored(max(math.sqrt(float((resid ** 2).sum()) / (len(resid) - 2)), parent_sd),
                  before, rel_floor, abs_floor)
    score = _z(after - before, sd * math.sqrt(1 / len(left) + 1 / len(right)))
    return _Split(score, _ratio_change(after, before), sd, before, after)


def _steps(x: np.ndarray, lo: int, hi: int, *, z: float, min_change: float,
           lower_is_better: bool, min_history: int, min_segment: int, rel_floor: float,
           abs_floor: float, parent_sd: float = 0.0) -> list[Detection]:
    """Binary segmentation of x[lo:hi] (module docstring); detections in index order."""
    seg = x[lo:hi]
    min_before = max(min_history, min_segment)
    if len(seg) < min_before + min_segment:
        return []
    t = _l1_split(seg, min_before, min_segment)
    split = _split_z(seg[:t], seg[t:], rel_floor=rel_floor, abs_floor=abs_floor,
                     parent_sd=parent_sd)
    if abs(split.z) < z or abs(split.change) < min_change:
        return []
    kw = dict(z=z, min_change=min_change, lower_is_better=lower_is_better,
              min_history=min_history, min_segment=min_segment, rel_floor=rel_floor,
              abs_floor=abs_floor, parent_sd=split.sd)
    here = Detection(lo + t, "step", _direction(split.change, lower_is_better), split.before,
                     split.after, split.change, split.z)
    return _steps(x, lo, lo + t, **kw) + [here] + _steps(x, lo + t, hi, **kw)


def _segments(x: np.ndarray, resets: Sequence[int], *, z: float, min_change: float,
              lower_is_better: bool, min_history: int, min_segment: int, rel_floor: float,
              abs_floor: float) -> tuple[list[Detection], list[int]]:
    """(steps found between resets, sorted starts of every baseline: 0, resets and steps)."""
    bounds = sorted({0, *(r for r in resets if 0 < r < len(x))}) + [len(x)]
    steps = []
    for lo, hi in zip(bounds, bounds[1:]):
        steps += _steps(x, lo, hi, z=z, min_change=min_change, lower_is_better=lower_is_better,
                        min_history=min_history, min_segment=min_segment, rel_floor=rel_floor,
                        abs_floor=abs_floor)
    return steps, sorted(set(bounds[:-1]) | {d.index for d in steps})


def detect(values: Sequence[float], *, z: float = Z, min_change: float = MIN_CHANGE,
           lower_is_better: bool = True, min_history: int = MIN_HISTORY,
           resets: Sequence[int] = (), window: int = WINDOW, rel_floor: float = REL_FLOOR,
           abs_floor: float = 0.0, min_segment: int = MIN_SEGMENT) -> list[Detection]:
    """Flagged indices of one series of per-run values, by the lookback z-score and the step
    detector of the module docstring; `resets` are indices where a new baseline starts (the
    point at a reset is the first of its segment, never compared with what came before).
    One Detection per flagged index, in index order."""
    x = np.asarray(values, dtype=np.float64)
    steps, starts = _segments(x, resets, z=z, min_change=min_change,
                              lower_is_better=lower_is_better, min_history=min_history,
                              min_segment=min_segment, rel_floor=rel_floor, abs_floor=abs_floor)
    found = {d.index: d for d in steps}
    for i in range(len(x)):
        if i in found:
            continue
        start = max(s for s in starts if s <= i)
        hit = lookback(x, i, start=start, z=z, min_change=min_change,
                       lower_is_better=lower_is_better, min_history=min_history, window=window,
                       rel_floor=rel_floor, abs_floor=abs_floor)
        if hit:
            found[i] = hit
    return [found[i] for i in sorted(found)]


@dataclass(frozen=True)
class LastPoint:
    """The newest point of a series judged against its history (`judge_last`)."""
    value: float
    baseline: float | None      # mean of the baseline; None under 2 points
    n_baseline: int
    change: float | None        # value / baseline - 1
    z: float | None
    verdict: str                # regression | improvement | same | short (under min_history)


def judge_last(values: Sequence[float], *, z: float = Z, min_change: float = MIN_CHANGE,
               lower_is_better: bool = True, min_history: int = MIN_HISTORY,
               resets: Sequence[int] = (), window: int = WINDOW, rel_floor: float = REL_FLOOR,
               abs_floor: float = 0.0, min_segment: int = MIN_SEGMENT) -> LastPoint:
    """The lookback z-score of the last value against the points before it, exactly as
    `detect` scores it (its baseline starts at the last reset or step detected before it)."""
    x = np.asarray(values, dtype=np.float64)
    last = len(x) - 1
    _, starts = _segments(x, resets, z=z, min_change=min_change,
                          lower_is_better=lower_is_better, min_history=min_history,
                          min_segment=min_segment, rel_floor=rel_floor, abs_floor=abs_floor)
    start = max(s for s in starts if s <= last)
    got = zscore(x, last, start=start, window=window, rel_floor=rel_floor, abs_floor=abs_floor)
    if got is None:
        return LastPoint(float(x[last]), None, last - start, None, None, "short")
    mean, score, change, n = got
    hit = lookback(x, last, start=start, z=z, min_change=min_change,
                   lower_is_better=lower_is_better, min_history=min_history, window=window,
                   rel_floor=rel_floor, abs_floor=abs_floor)
    verdict = "short" if n < min_history else (hit.direction if hit else "same")
    return LastPoint(float(x[last]), mean, n, change, score, verdict)


# --- series from the store ---------------------------------------------------------------------

def _run_started(store: Store) -> dict[str, datetime]:
    runs = store.read("runs").select(["run_id", "started"]).to_pylist()
    return {r["run_id"]: r["started"] for r in runs}


def repro_runs(store: Store) -> set[str]:
    """Run ids of `kparity repro` runs: never part of a history series."""
    runs = store.read("runs").select(["run_id", "verb"]).to_pylist()
    return {r["run_id"] for r in runs if r["verb"] == "repro"}


def metric_rows(store: Store, metric: str, *, impl: str | None = None,
                device: str | None = None, runs: set[str] | None = None) -> list[dict]:
    """The rows a metric's history is made of (module docstring), as dicts without raw samples;
    optionally only one impl, one device (exact string), or some runs."""
    if metric not in METRICS:
        raise ValueError(f"metric {metric!r}: one of {sorted(METRICS)}")
    table_name, column = METRICS[metric]
    cols = ["run_id", "case_id", "impl", "op", "device", "dtype", "label", "status", column]
    if table_name == "bench":
        cols += ["mode", "arm", "q1_ns", "q3_ns"]
    rows = store.read(table_name).select(cols).to_pylist()
    repro = repro_runs(store)
    out = []
    for r in rows:
        if r[column] is None or (runs is not None and r["run_id"] not in runs) \
                or r["run_id"] in repro:
            continue
        if table_name == "bench" and (r["arm"] not in ("", None) or r["status"] != "ok"):
            continue
        if (impl is not None and r["impl"] != impl) or (device is not None
                                                          and r["device"] != device):
            continue
        out.append(r)
    return out


def row_key(metric: str, row: dict) -> SeriesKey:
    return SeriesKey(metric, row["impl"], row["case_id"], row.get("mode") or "",
                     row["device"] or "")


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else None


def build_series(metric: str, rows: list[dict], started: dict[str, datetime]) -> list[Series]:
    """Series from `metric_rows` rows: one point per run, the median of the run's rows for a
    time and their worst (max) for a budget, as `compare` and the SQL `history` view take it."""
    column = METRICS[metric][1]
    meta: dict[SeriesKey, dict] = {}
    by_run: dict[SeriesKey, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = row_key(metric, r)
        meta.setdefault(key, r)
        by_run[key][r["run_id"]].append(r)
    out = []
    for key in sorted(by_run):
        points = []
        for run_id in sorted(by_run[key]):
            rs = by_run[key][run_id]
            lo = _median([r.get("q1_ns") for r in rs]) if metric == "median_ns" else None
            hi = _median([r.get("q3_ns") for r in rs]) if metric == "median_ns" else None
            values = [r[column] for r in rs if r[column] is not None]
            value = max(values, default=None) if metric == "budget" else _median(values)
            points.append(Point(run_id, started.get(run_id) or started_from_id(run_id),
                                value, lo, hi))
        m = meta[key]
        out.append(Series(key, m["op"] or "", m["dtype"] or "", m["label"] or "", points))
    return out


def series(store: Store, metric: str, *, impl: str | None = None,
           device: str | None = None) -> list[Series]:
    """Every series of `metric` ("median_ns" or "budget") in the store, sorted by key."""
    return build_series(metric, metric_rows(store, metric, impl=impl, device=device),
                        _run_started(store))


# --- annotations and regressions ---------------------------------------------------------------

def annotations(store: Store) -> list[dict]:
    """Annotation rows of kind accept, oldest first."""
    rows = store.read("annotations").to_pylist()
    return sorted((r for r in rows if r["kind"] == "accept"),
                  key=lambda r: (r["run_id"], r["created"]))


def matches(annotation: dict, key: SeriesKey) -> bool:
    """Whether an annotation applies to a series: target = its impl or case id, metric "" or
    the series' metric."""
    return (annotation["target"] in (key.impl, key.case_id)
            and annotation["metric"] in ("", None, key.metric))


def reset_index(run_ids: list[str], run_id: str) -> int | None:
    """Index of the first of `run_ids` (oldest first) at or after run `run_id` (None when every
    one is older)."""
    return next((i for i, r in enumerate(run_ids) if r >= run_id), None)


def detect_kwargs(metric: str, **overrides) -> dict:
    """detect()'s settings for a metric: lower is better for both, the metric's abs_floor."""
    return {"lower_is_better": True, "abs_floor": ABS_FLOOR[metric], **overrides}


def series_alerts(s: Series, notes: list[dict], **settings) -> list[Alert]:
    """Alerts of one series under the annotations that match it (module docstring)."""
    values = [p.value for p in s.points]
    kw = detect_kwargs(s.key.metric, **settings)
    resets = {}
    for a in notes:
        r = reset_index([p.run_id for p in s.points], a["run_id"])
        if r is not None:
            resets[r] = a["reason"]
    found = {d.index: d for d in detect(values, resets=sorted(resets), **kw)}
    accepted: dict[int, str] = {}
    if resets:
        raw = detect(values, **kw)
        raw_steps = [d.index for d in raw if d.kind == "step"]
        for r, reason in resets.items():
            level_start = max([i for i in raw_steps if i <= r], default=r)
            for i in range(level_start, r + 1):
                accepted[i] = reason
        for d in raw:  # the accepted change itself, as seen without the reset
            if d.index in accepted and d.index not in found:
                found[d.index] = d
    return [Alert(s.key, s.points[d.index].run_id, d.index, d.kind, d.direction, d.baseline,
                  d.value, d.change, d.z, accepted.get(d.index))
            for d in (found[i] for i in sorted(found))]


def scan(store: Store, *, metrics: Sequence[str] = ("median_ns", "budget"),
         baseline: int | None = None, impl: str | None = None, device: str | None = None,
         **settings) -> tuple[list[Alert], int, int]:
    """(alerts, series judged, series not judged) over every series of each metric (see
    `regressions`). A series is judged when its newest point has at least min_history points
    before it (resets aside); a shorter one cannot raise an alert for its newest run, and is
    counted as not judged instead of passing for "no change"."""
    started = _run_started(store)
    notes = annotations(store)
    need = settings.get("min_history", MIN_HISTORY)
    alerts, judged, short = [], 0, 0
    for metric in metrics:
        rows = metric_rows(store, metric, impl=impl, device=device)
        if baseline is not None:
            keep = set(sorted({r["run_id"] for r in rows})[-baseline:])
            rows = [r for r in rows if r["run_id"] in keep]
        for s in build_series(metric, rows, started):
            alerts += series_alerts(s, [a for a in notes if matches(a, s.key)], **settings)
            if len(s.points) > need:
                judged += 1
            else:
                short += 1
    return alerts, judged, short


def regressions(store: Store, *, metrics: Sequence[str] = ("median_ns", "budget"),
                baseline: int | None = None, impl: str | None = None,
                device: str | None = None, **settings) -> list[Alert]:
    """Alerts (regressions and improvements, accepted ones marked) over every series of each
    metric; with `baseline`, only the last `baseline` runs that have rows of the metric's table
    count. `settings` override detect()'s defaults (z, min_change, ...)."""
    return scan(store, metrics=metrics, baseline=baseline, impl=impl, device=device,
                **settings)[0]
