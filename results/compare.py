"""`kparity compare`: what changed between two runs, or between a run and its recent history.

Which runs. Only runs with rows of a compared table count: correctness rows (check, repro) or
plain bench rows (bench; A/B arms are not history). Device kind: two runs are of one kind when
they share a backend and every backend both ran has the same device string in `runs.devices`.
A `kparity repro` run (`runs.verb`) is never picked: not as A, not as history, not as the
default B (a 3-case rerun is no sweep to compare with); named by its id, it is compared.

- pair, default: B = the newest run; A = the newest earlier run of B's device kind that shares
  an (impl, case) of a table with B (so after a bench run, A is the previous bench run of
  those cases on that device; after a check, the previous check of them). One positional: that run is A, B the newest later run so
  chosen. Two positionals: exactly those runs. The tables compared are those both runs have.
- `--baseline N`: the contender (the newest run, or the one positional) against, per table,
  the last N earlier runs of its device kind sharing cases of that table with it (N >= 2).

Correctness, per (impl, case_id) (a run's several rows of one key: the worst of them):
- new_failure: A passing, B failing (`runners.verdicts.is_failure`); fixed: the reverse;
  still_failing: both failing (listed, not a regression: nothing changed).
- new_case_failure: a key only in B (with --baseline: in no history run), failing in B. A
  failing case with no history is a failure to report, not just "new": listed first and a
  regression, unless `--new-may-fail` (`Thresholds.new_may_fail`: a mutant's or a new
  kernel's check, where failures are expected) accepts it. New passing keys are only counted.
- budget_jump: both passing and B.budget >= budget_jump * A.budget (default 2) and
  B.budget >= BUDGET_FLOOR (0.05 of the tolerance: 1e-9 -> 3e-9 is bit noise, not a jump);
  budget_drop: the mirror image (A.budget >= budget_jump * B.budget, A.budget >= floor).
- With --baseline, A is the newest history row for failures, and the budget is judged by
  `history.judge_last` (lookback z-score over the history, same z / min_change, the budget's
  floor of 0.01) instead of the ratio; a jump still needs B.budget >= BUDGET_FLOOR. A budget
  with fewer than min_history earlier values (since the last reset) is not_judged, counted
  apart with its history length ("not judged (1 of 10 runs)"), never "unchanged".
  unchanged: the status is the same and the budget, where both have one, judged the same.
Cases in only one run are counted (new_cases, missing_cases).

Speed, per (impl, case_id, mode) of plain `ok` bench rows:
- ratio = median(B samples) / median(A samples) (the rows' median_ns); 95 % interval: the
  bootstrap over both runs' raw samples_ns (N_BOOT = 2000 resamples, seed 0; rows without raw
  samples get a point interval). Verdict as `runners.abstats.verdict` with delta = min_change:
  SLOWER / FASTER when the interval excludes 1 and |ratio - 1| >= min_change, SAME when the
  interval lies within 1 +- min_change, else AMBIGUOUS. Samples within one run are correlated
  and a pair of runs cannot see run-to-run noise (an A/A pair of runs differs by more than its
  sample interval), so the interval alone would call noise a change: min_change (5 %) is the
  floor of what counts, and `--baseline` (history) is the tool for smaller changes.
- FAILED: timed in A, not in B (wrong results or an error); RECOVERED: the reverse; NOT_TIMED:
  neither. NEW_FAILED: only in B, and not timed there because it failed or raised (status
  fail or error, as `kparity bench` exits 1 on): a regression unless --new-may-fail, like
  new_case_failure.
- With --baseline: `history.judge_last` on the run medians, contender last: SLOWER / FASTER when
  flagged, SAME when not, NOT_JUDGED when the series has under min(N, 10) runs of history
  (`history_runs` says how many).

A regression: any new_failure, new_case_failure, budget_jump, SLOWER, FAILED or NEW_FAILED
that nothing accepts. An annotation (`kparity accept`) accepts a change when it matches the
series (target = impl or case id, metric "" or the series' metric: `budget` for correctness,
`median_ns` for speed) and its run is after A and at most B (with --baseline: after the newest
history run of that table, up to the contender); older annotations reset the history (with
--baseline). Accepted changes are listed with `accepted_by` and do not fail the comparison.
An annotation never accepts a correctness failure (new_failure, new_case_failure): accept is
for speed and error-budget baselines; a known failure belongs in the known-issues ledger
(`gpu_impls/known_issues.py`, with its tracked issue), which records it as xfail, not failing.

The runs compared are chosen in `results/compare_runs.py`; the report is rendered for a reader
in `results/compare_render.py`.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from results import history
from results.compare_runs import (CompareError, devices_of, load, pick_baseline, pick_pair,
                                  same_device_kind)
from results.store import Store
from runners.abstats import bootstrap_ratio, verdict as speed_verdict
from runners.verdicts import is_failure

SCHEMA_PATH = Path(__file__).with_name("compare.schema.json")
BUDGET_FLOOR = 0.05
N_BOOT = 2000
LEVEL = 0.95
SEED = 0
REGRESSING = {"new_failure", "new_case_failure", "budget_jump", "SLOWER", "FAILED",
              "NEW_FAILED"}
IMPROVING = {"fixed", "budget_drop", "FASTER", "RECOVERED"}
UNDECIDED = {"AMBIGUOUS"}
NOT_JUDGED = {"not_judged", "NOT_JUDGED"}
FAILURES = {"new_failure", "new_case_failure"}  # correctness failures: no annotation accepts them
NEW_FAILURES = {"new_case_failure", "NEW_FAILED"}
BENCH_FAILING = ("fail", "error")  # a bench row not timed because the kernel is wrong or raised
NEW_MAY_FAIL = "new cases may fail (--new-may-fail)"


@dataclass
class Thresholds:
    z: float = history.Z
    min_change: float = history.MIN_CHANGE
    budget_jump: float = 2.0
    budget_floor: float = BUDGET_FLOOR
    n_boot: int = N_BOOT
    level: float = LEVEL
    min_history: int | None = None   # set with --baseline: min(N, history.MIN_HISTORY)
    new_may_fail: bool = False       # new failing cases are expected (accepted, not regressions)


# --- per-key reduction -------------------------------------------------------------------------

def _by_key(rows: list[dict], keyf) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[keyf(r)].append(r)
    return out


def _corr_key(r: dict) -> tuple:
    return r["impl"], r["case_id"]


def _speed_key(r: dict) -> tuple:
    return r["impl"], r["case_id"], r["mode"] or ""


def _worst(rows: list[dict]) -> dict:
    """One correctness row per key and run: a failing one if any; the largest budget."""
    failing = [r for r in rows if is_failure(r)]
    pick = (failing or rows)[-1]
    budgets = [r["budget"] for r in rows if r["budget"] is not None]
    return {**pick, "budget": max(budgets) if budgets else None}


def _case_fields(r: dict) -> dict:
    return {"impl": r["impl"], "case_id": r["case_id"], "op": r["op"] or "",
            "dtype": r["dtype"] or "", "label": r["label"] or ""}


def _accepting(notes: list[dict], key: history.SeriesKey, after: str, upto: str) -> str | None:
    """The reason of the newest annotation matching `key` in runs (after, upto], if any."""
    hits = [a for a in notes if after < a["run_id"] <= upto and history.matches(a, key)]
    return hits[-1]["reason"] if hits else None


def _direction(change: str) -> str:
    if change in REGRESSING:
        return "regression"
    if change in IMPROVING:
        return "improvement"
    if change in NOT_JUDGED:
        return "not_judged"
    return "ambiguous" if change in UNDECIDED else "unchanged"


def _acceptance(change: str, annotation: str | None, th: Thresholds) -> str | None:
    """What accepts a change: `--new-may-fail` a new failing case; an annotation (its reason)
    anything but a correctness failure (module docstring)."""
    if change in NEW_FAILURES:
        return NEW_MAY_FAIL if th.new_may_fail else None
    return None if change in FAILURES else annotation


def _entry(fields: dict, change_field: str, change: str, annotation: str | None,
           th: Thresholds) -> dict:
    direction = _direction(change)
    accepted = _acceptance(change, annotation, th)
    return {**fields, change_field: change, "direction": direction,
            "regression": direction == "regression" and accepted is None,
            "accepted_by": accepted if direction in ("regression", "improvement") else None}


# --- correctness -------------------------------------------------------------------------------

def _budget_change(a: float | None, b: float | None, th: Thresholds) -> str:
    if a is None or b is None:
        return "unchanged"
    if b >= th.budget_jump * a and b >= th.budget_floor:
        return "budget_jump"
    if a >= th.budget_jump * b and a >= th.budget_floor:
        return "budget_drop"
    return "unchanged"


def _status_change(a: dict, b: dict) -> str | None:
    fa, fb = is_failure(a), is_failure(b)
    if fa and fb:
        return "still_failing"
    if fa != fb:
        return "new_failure" if fb else "fixed"
    return None


def _new_case_failures(now: dict, known, th: Thresholds) -> tuple[list[dict], Counter]:
    """Entries of the keys of `now` (key -> worst row) not in `known` that fail, and the
    counts new_cases (every new key) and new_case_failure."""
    new = sorted(now.keys() - set(known))
    failing = [now[k] for k in new if is_failure(now[k])]
    entries = [_entry({**_case_fields(r), "status_a": None, "status_b": r["status"],
                       "budget_a": None, "budget_b": r["budget"], "z": None}, "change",
                      "new_case_failure", None, th) for r in failing]
    return entries, Counter(new_cases=len(new), new_case_failure=len(failing))


def correctness_pair(rows_a: list[dict], rows_b: list[dict], notes: list[dict], run_a: str,
                     run_b: str, th: Thresholds) -> tuple[list[dict], Counter]:
    a = {k: _worst(v) for k, v in _by_key(rows_a, _corr_key).items()}
    b = {k: _worst(v) for k, v in _by_key(rows_b, _corr_key).items()}
    entries, counts = _new_case_failures(b, a, th)
    counts["missing_cases"] = len(a.keys() - b.keys())
    for k in sorted(a.keys() & b.keys()):
        ra, rb = a[k], b[k]
        change = _status_change(ra, rb) or _budget_change(ra["budget"], rb["budget"], th)
        counts[change] += 1
        if change == "unchanged":
            continue
        key = history.row_key("budget", rb)
        entries.append(_entry({**_case_fields(rb), "status_a": ra["status"],
                               "status_b": rb["status"], "budget_a": ra["budget"],
                               "budget_b": rb["budget"], "z": None}, "change", change,
                              _accepting(notes, key, run_a, run_b), th))
    return entries, counts


def _resets(notes: list[dict], key: history.SeriesKey, runs: list[str]) -> list[int]:
    """History indices where a matching annotation restarts the baseline."""
    out = []
    for a in notes:
        if history.matches(a, key):
            i = history.reset_index(runs, a["run_id"])
            if i is not None and i < len(runs) - 1:  # one at the contender accepts instead
                out.append(i)
    return out


def correctness_baseline(history_rows: list[dict], rows_c: list[dict], notes: list[dict],
                         contender: str, th: Thresholds) -> tuple[list[dict], Counter, list[int]]:
    """(entries, counts, the history length of each not_judged key)."""
    runs = sorted({r["run_id"] for r in history_rows})
    past = _by_key(history_rows, _corr_key)
    now = {k: _worst(v) for k, v in _by_key(rows_c, _corr_key).items()}
    entries, counts = _new_case_failures(now, past, th)
    counts["missing_cases"] = len(past.keys() - now.keys())
    short = []
    for k in sorted(now.keys() & past.keys()):
        per_run = {run: _worst(rs) for run, rs in _by_key(past[k], lambda r: r["run_id"]).items()}
        order = sorted(per_run)
        latest, rb = per_run[order[-1]], now[k]
        key = history.row_key("budget", rb)
        change, z, budget_a = _status_change(latest, rb), None, latest["budget"]
        points = [(run, per_run[run]["budget"]) for run in order
                  if per_run[run]["budget"] is not None]
        if change is None and rb["budget"] is not None:
            ids = [run for run, _ in points] + [contender]
            judged = history.judge_last(
                [v for _, v in points] + [rb["budget"]], resets=_resets(notes, key, ids),
                **history.detect_kwargs("budget", z=th.z, min_change=th.min_change,
                                        min_history=th.min_history))
            z, budget_a = judged.z, judged.baseline
            if judged.verdict == "short":
                change = "not_judged"
                short.append(judged.n_baseline)
            elif judged.verdict == "regression" and rb["budget"] >= th.budget_floor:
                change = "budget_jump"
            elif judged.verdict == "improvement" and (judged.baseline or 0) >= th.budget_floor:
                change = "budget_drop"
        change = change or "unchanged"
        counts[change] += 1
        if change in ("unchanged", "not_judged"):
            continue
        entries.append(_entry({**_case_fields(rb), "status_a": latest["status"],
                               "status_b": rb["status"], "budget_a": budget_a,
                               "budget_b": rb["budget"], "z": z}, "change", change,
                              _accepting(notes, key, runs[-1], contender), th))
    return entries, counts, short


# --- speed -------------------------------------------------------------------------------------

def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "ok" and r["median_ns"] is not None]


def _samples(bench_table, run_id: str) -> dict[tuple, np.ndarray]:
    """Raw samples of a run's plain ok bench rows, per (impl, case_id, mode)."""
    t = bench_table.filter(pc.field("run_id") == run_id).select(
        ["impl", "case_id", "mode", "arm", "status", "samples_ns"]).to_pylist()
    out = defaultdict(list)
    for r in t:
        if r["arm"] in ("", None) and r["status"] == "ok":
            out[_speed_key(r)] += r["samples_ns"] or []
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def _speed_fields(r: dict, status_a: str | None, status_b: str) -> dict:
    return {**_case_fields(r), "mode": r["mode"] or "", "status_a": status_a,
            "status_b": status_b, "median_a_ns": None, "median_b_ns": None, "ratio": None,
            "ci_lo": None, "ci_hi": None, "z": None, "history_runs": None}


def _new_speed_failures(now: dict, known, th: Thresholds) -> tuple[list[dict], Counter]:
    """NEW_FAILED entries of the keys of `now` (key -> rows) not in `known` that no row timed
    and one failed or raised; the counts new_cases and new_failed."""
    new = sorted(now.keys() - set(known))
    failing = [now[k][-1] for k in new if not _timed(now[k])
               and any(r["status"] in BENCH_FAILING for r in now[k])]
    entries = [_entry(_speed_fields(r, None, r["status"]), "verdict", "NEW_FAILED", None, th)
               for r in failing]
    return entries, Counter(new_cases=len(new), NEW_FAILED=len(failing))


def _untimed_change(ok_a: bool, ok_b: bool) -> str | None:
    if ok_a and not ok_b:
        return "FAILED"
    if ok_b and not ok_a:
        return "RECOVERED"
    return None if ok_a else "NOT_TIMED"


def speed_pair(rows_a: list[dict], rows_b: list[dict], samples_a: dict, samples_b: dict,
               notes: list[dict], run_a: str, run_b: str,
               th: Thresholds) -> tuple[list[dict], Counter]:
    a, b = _by_key(rows_a, _speed_key), _by_key(rows_b, _speed_key)
    entries, counts = _new_speed_failures(b, a, th)
    counts["missing_cases"] = len(a.keys() - b.keys())
    for k in sorted(a.keys() & b.keys()):
        ta, tb = _timed(a[k]), _timed(b[k])
        fields = _speed_fields(b[k][-1], a[k][-1]["status"], b[k][-1]["status"])
        change = _untimed_change(bool(ta), bool(tb))
        if change is None:
            ma = float(np.median([r["median_ns"] for r in ta]))
            mb = float(np.median([r["median_ns"] for r in tb]))
            sa, sb = samples_a.get(k, np.zeros(0)), samples_b.get(k, np.zeros(0))
            if sa.size and sb.size:
                ratio, lo, hi = bootstrap_ratio(sa, sb, n_boot=th.n_boot, seed=SEED,
                                                level=th.level)
            else:
                ratio = lo = hi = mb / ma
            change = speed_verdict(ratio, lo, hi, th.min_change)
            fields.update(median_a_ns=ma, median_b_ns=mb, ratio=ratio, ci_lo=lo, ci_hi=hi)
        counts[change] += 1
        key = history.row_key("median_ns", b[k][-1])
        entries.append(_entry(fields, "verdict", change, _accepting(notes, key, run_a, run_b),
                              th))
    return entries, counts


def speed_baseline(history_rows: list[dict], rows_c: list[dict], notes: list[dict],
                   contender: str, th: Thresholds) -> tuple[list[dict], Counter]:
    runs = sorted({r["run_id"] for r in history_rows})
    past, now = _by_key(history_rows, _speed_key), _by_key(rows_c, _speed_key)
    entries, counts = _new_speed_failures(now, past, th)
    counts["missing_cases"] = len(past.keys() - now.keys())
    for k in sorted(now.keys() & past.keys()):
        per_run = _by_key(past[k], lambda r: r["run_id"])
        order = sorted(per_run)
        latest = per_run[order[-1]][-1]
        tc = _timed(now[k])
        fields = _speed_fields(now[k][-1], latest["status"], now[k][-1]["status"])
        change = _untimed_change(bool(_timed(per_run[order[-1]])), bool(tc))
        points = [(run, float(np.median([r["median_ns"] for r in _timed(per_run[run])])))
                  for run in order if _timed(per_run[run])]
        key = history.row_key("median_ns", now[k][-1])
        if change is None:
            mc = float(np.median([r["median_ns"] for r in tc]))
            ids = [run for run, _ in points] + [contender]
            judged = history.judge_last(
                [v for _, v in points] + [mc], resets=_resets(notes, key, ids),
                **history.detect_kwargs("median_ns", z=th.z, min_change=th.min_change,
                                        min_history=th.min_history))
            change = {"regression": "SLOWER", "improvement": "FASTER", "same": "SAME",
                      "short": "NOT_JUDGED"}[judged.verdict]
            fields.update(median_a_ns=judged.baseline, median_b_ns=mc, z=judged.z,
                          ratio=None if judged.change is None else judged.change + 1,
                          history_runs=judged.n_baseline)
        counts[change] += 1
        entries.append(_entry(fields, "verdict", change, _accepting(notes, key, runs[-1],
                                                                   contender), th))
    return entries, counts


# --- the whole comparison ----------------------------------------------------------------------

CORRECTNESS_COUNTS = ("new_case_failure", "new_failure", "fixed", "budget_jump", "budget_drop",
                      "still_failing", "unchanged", "not_judged", "new_cases", "missing_cases")
SPEED_COUNTS = ("NEW_FAILED", "SLOWER", "FASTER", "SAME", "AMBIGUOUS", "NOT_JUDGED", "FAILED",
                "RECOVERED", "NOT_TIMED", "new_cases", "missing_cases")


def _change(entry: dict) -> str:
    return entry.get("change") or entry["verdict"]


def _order(entry: dict) -> tuple:
    """Regressions first, new failing cases first among them; then by direction and case."""
    rank = {"regression": 0, "improvement": 1, "ambiguous": 2, "not_judged": 3, "unchanged": 4}
    return (not entry["regression"], _change(entry) not in NEW_FAILURES,
            rank[entry["direction"]], entry["impl"], entry["label"], entry["dtype"],
            entry["case_id"], entry.get("mode", ""))


def summarize(correctness: list[dict], speed: list[dict], c_counts: Counter,
              s_counts: Counter, short: list[int], needed: int | None) -> dict:
    """Counts over every compared key (unchanged and not judged correctness keys are counted,
    not listed); `short`: the history length of each not judged key, of `needed`."""
    listed = correctness + speed
    unchanged = c_counts["unchanged"] + sum(e["direction"] == "unchanged" for e in listed)
    short = short + [e["history_runs"] for e in speed if e["verdict"] == "NOT_JUDGED"]
    return {
        "regressions": sum(e["regression"] for e in listed),
        "improvements": sum(e["direction"] == "improvement" for e in listed),
        "unchanged": unchanged,
        "not_judged": len(short),
        "not_judged_history": {"min_runs": min(short), "max_runs": max(short),
                               "needed": needed} if short else None,
        "ambiguous": sum(e["direction"] == "ambiguous" for e in listed),
        "accepted": sum(e["accepted_by"] is not None and e["direction"] == "regression"
                        for e in listed),
        "correctness": {k.lower(): c_counts[k] for k in CORRECTNESS_COUNTS},
        "speed": {k.lower(): s_counts[k] for k in SPEED_COUNTS},
    }


def compare(store: Store, run_a: str | None = None, run_b: str | None = None, *,
            baseline: int | None = None, filters: dict[str, list[str]] | None = None,
            thresholds: Thresholds | None = None) -> dict:
    """The comparison as a JSON-ready dict (schema: results/compare.schema.json)."""
    th = thresholds or Thresholds()
    data = load(store, filters)
    notes = history.annotations(store)
    correctness, speed, cc, sc, short = [], [], Counter(), Counter(), []
    if baseline is None:
        a, b = pick_pair(data, run_a, run_b)
        tables = data.tables_of(a) & data.tables_of(b)
        if not tables:
            raise CompareError(f"run {a} has {'+'.join(sorted(data.tables_of(a)))} rows and run "
                               f"{b} has {'+'.join(sorted(data.tables_of(b)))} rows: no table "
                               f"in common to compare")
        rows = {t: _by_key(data.rows[t], lambda r: r["run_id"]) for t in tables}
        if "correctness" in tables:
            correctness, cc = correctness_pair(rows["correctness"][a], rows["correctness"][b],
                                               notes, a, b, th)
        if "bench" in tables:
            speed, sc = speed_pair(rows["bench"][a], rows["bench"][b],
                                   _samples(data.bench, a), _samples(data.bench, b), notes, a,
                                   b, th)
        contender, baseline_runs, run_a_out = b, [a], a
    else:
        if baseline < 2:
            raise CompareError(f"--baseline {baseline}: a history needs at least 2 runs")
        if run_a is not None and run_b is not None:
            raise CompareError("--baseline compares one run (the contender) with its history: "
                               "give at most one run id")
        contender, hist = pick_baseline(data, run_a or run_b, baseline)
        th = replace(th, min_history=min(baseline, history.MIN_HISTORY))
        tables = set(hist)
        mine = {t: [r for r in data.rows[t] if r["run_id"] == contender] for t in tables}
        past = {t: [r for r in data.rows[t] if r["run_id"] in set(hist[t])] for t in tables}
        if "correctness" in tables:
            correctness, cc, short = correctness_baseline(
                past["correctness"], mine["correctness"], notes, contender, th)
        if "bench" in tables:
            speed, sc = speed_baseline(past["bench"], mine["bench"], notes, contender, th)
        baseline_runs, run_a_out = sorted({r for runs in hist.values() for r in runs}), None
    correctness.sort(key=_order)
    speed.sort(key=_order)
    summary = summarize(correctness, speed, cc, sc, short, th.min_history)
    return _finite({
        "mode": "pair" if baseline is None else "baseline",
        "run_a": run_a_out,
        "run_b": contender,
        "baseline_runs": baseline_runs,
        "tables": sorted(tables),
        "devices": {"a": devices_of(data, run_a_out) if run_a_out else None,
                    "b": devices_of(data, contender)},
        "same_device_kind": run_a_out is None or same_device_kind(devices_of(data, run_a_out),
                                                                  devices_of(data, contender)),
        "thresholds": vars(th).copy(),
        "correctness": correctness,
        "speed": speed,
        "summary": summary,
        "regression": summary["regressions"] > 0,
    })


def _finite(obj):
    """JSON has no infinities: a non-finite float (a change from 0) becomes null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())
