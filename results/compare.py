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
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from results import history
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


class CompareError(Exception):
    """Nothing to compare as asked (exit 2). For an unknown name (a run id, or a filter value
    no row has), `kind`, `given` and `valid` say which and what exists."""

    def __init__(self, message: str, kind: str | None = None, given: str | None = None,
                 valid=()):
        super().__init__(message)
        self.kind, self.given, self.valid = kind, given, sorted(set(valid))


FILTERS = ("op", "impl", "backend", "dtype", "preset")


def _filter_values(kind: str, row: dict) -> set[str]:
    """The values of a row that a filter of this kind can name (an impl by id or by name)."""
    if kind == "impl":
        return {row["impl"], row["impl"].split(":", 1)[-1]}
    if kind == "preset":
        return {row["label"].split(":", 1)[-1]} if row["label"] else set()
    return {row[kind]} if row[kind] else set()


def row_filter(filters: dict[str, list[str]], rows: list[dict]):
    """keep(row) for the CLI filters (kinds as in FILTERS; a preset is a label substring),
    after checking that each value names something in `rows` (else CompareError)."""
    filters = {k: v for k, v in filters.items() if v}
    for kind, wanted in filters.items():
        have = set().union(*(_filter_values(kind, r) for r in rows)) if rows else set()
        for w in wanted:
            if not (any(w in h for h in have) if kind == "preset" else w in have):
                raise CompareError(f"unknown {kind} {w!r}", kind, w, have)

    def keep(row: dict) -> bool:
        for kind, wanted in filters.items():
            values = _filter_values(kind, row)
            if kind == "preset":
                if not any(w in (row["label"] or "") for w in wanted):
                    return False
            elif not values & set(wanted):
                return False
        return True
    return keep


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


CASE_COLUMNS = ["run_id", "case_id", "impl", "op", "backend", "device", "dtype", "label"]
CORRECTNESS_COLUMNS = ["expect", "status", "budget"]
BENCH_COLUMNS = ["mode", "arm", "status", "median_ns"]  # raw samples: only for the runs compared


@dataclass
class StoreRows:
    """The store's comparable rows (filtered), without raw samples, and the runs table."""
    runs: dict[str, dict]                       # run_id -> runs row (devices parsed)
    rows: dict[str, list[dict]]                 # table -> rows
    bench: pa.Table | None = None               # the whole bench table (for raw samples)
    by_run: dict[str, set[str]] = field(default_factory=dict)  # run_id -> tables it has
    keys: dict[str, set[tuple]] = field(default_factory=dict)  # run_id -> (table, impl, case)

    def tables_of(self, run_id: str) -> set[str]:
        return self.by_run.get(run_id, set())

    def is_repro(self, run_id: str) -> bool:
        """A `kparity repro` run: a few cases rerun, never a baseline (module docstring)."""
        return self.runs.get(run_id, {}).get("verb") == "repro"

    def newest(self) -> str | None:
        """The newest comparable run that is not a repro."""
        return max((r for r in self.by_run if not self.is_repro(r)), default=None)

    def share_cases(self, a: str, b: str, tables: set[str]) -> bool:
        """Whether runs a and b have an (impl, case) of one of `tables` in common: two bench
        runs of different commands (say rms_norm, then GEMV) have nothing to compare."""
        return any(k[0] in tables for k in self.keys.get(a, set()) & self.keys.get(b, set()))


# --- loading and selection ---------------------------------------------------------------------

def load(store: Store, filters: dict[str, list[str]] | None = None) -> StoreRows:
    """Correctness rows and plain bench rows passing the filters (`row_filter`), every run."""
    runs = {}
    for r in store.read("runs").to_pylist():
        runs[r["run_id"]] = {**r, "devices": json.loads(r["devices"] or "{}")}
    correctness = store.read("correctness").select(CASE_COLUMNS + CORRECTNESS_COLUMNS).to_pylist()
    bench_table = store.read("bench")
    bench = [r for r in bench_table.select(CASE_COLUMNS + BENCH_COLUMNS).to_pylist()
             if r["arm"] in ("", None)]
    keep = row_filter(filters or {}, correctness + bench)
    got = StoreRows(runs, {"correctness": [r for r in correctness if keep(r)],
                           "bench": [r for r in bench if keep(r)]}, bench_table)
    for table, rows in got.rows.items():
        for r in rows:
            got.by_run.setdefault(r["run_id"], set()).add(table)
            got.keys.setdefault(r["run_id"], set()).add((table, r["impl"], r["case_id"]))
    return got


def same_device_kind(a: dict, b: dict) -> bool:
    """Two runs' `devices` (backend -> device): a backend in common, none that differs."""
    common = set(a) & set(b)
    return bool(common) and all(a[k] == b[k] for k in common)


def _devices(data: StoreRows, run_id: str) -> dict:
    return data.runs.get(run_id, {}).get("devices", {})


def _present(data: StoreRows) -> str:
    """The comparable runs, for an error message: id, verb, tables, devices."""
    lines = []
    for run_id in sorted(data.by_run):
        run = data.runs.get(run_id, {})
        devices = ", ".join(f"{k}={v}" for k, v in sorted(run.get("devices", {}).items()))
        lines.append(f"{run_id} ({run.get('verb', '?')}: "
                     f"{'+'.join(sorted(data.tables_of(run_id)))}; {devices or 'no runs row'})")
    return "; ".join(lines) or "none"


def _check_run(data: StoreRows, run_id: str) -> None:
    if run_id not in data.by_run:
        valid = sorted(data.by_run)
        if run_id in data.runs:
            raise CompareError(f"run {run_id} has no correctness or plain bench rows (matching "
                               f"the filters); comparable runs: {_present(data)}")
        raise CompareError(f"unknown run {run_id!r}", "run", run_id, valid)


def _peers(data: StoreRows, run_id: str, tables: set[str]) -> list[str]:
    """Comparable runs of run_id's device kind sharing an (impl, case) of one of `tables` with
    it, oldest first; repro runs are no one's peer."""
    mine = _devices(data, run_id)
    return sorted(r for r in data.by_run if r != run_id and not data.is_repro(r)
                  and data.share_cases(r, run_id, tables)
                  and same_device_kind(mine, _devices(data, r)))


def pick_pair(data: StoreRows, run_a: str | None, run_b: str | None) -> tuple[str, str]:
    """(A, B) as the module docstring says."""
    for given in (run_a, run_b):
        if given is not None:
            _check_run(data, given)
    if run_a is not None and run_b is not None:
        return run_a, run_b
    if run_a is not None:
        later = [r for r in _peers(data, run_a, data.tables_of(run_a)) if r > run_a]
        if not later:
            raise CompareError(f"no run after {run_a} of its device kind sharing cases with it; "
                               f"comparable runs: {_present(data)}")
        return run_a, later[-1]
    newest = data.newest()
    if newest is None:
        raise CompareError("no runs with correctness or plain bench rows (matching the filters) "
                           "in the store, other than repro runs")
    earlier = [r for r in _peers(data, newest, data.tables_of(newest)) if r < newest]
    if not earlier:
        raise CompareError(f"the newest run {newest} has no earlier run of the same device kind "
                           f"sharing {' or '.join(sorted(data.tables_of(newest)))} cases with it; "
                           f"comparable runs: {_present(data)}")
    return earlier[-1], newest


def pick_baseline(data: StoreRows, contender: str | None, n: int) -> tuple[str, dict]:
    """(contender, table -> its last n earlier peer runs with rows of that table)."""
    if contender is not None:
        _check_run(data, contender)
    elif data.newest() is None:
        raise CompareError("no runs with correctness or plain bench rows (matching the filters) "
                           "in the store, other than repro runs")
    contender = contender or data.newest()
    hist = {}
    for table in sorted(data.tables_of(contender)):
        runs = [r for r in _peers(data, contender, {table}) if r < contender
                and table in data.tables_of(r)]
        if runs:
            hist[table] = runs[-n:]
    if not hist:
        raise CompareError(f"run {contender} has no earlier run of the same device kind with "
                           f"{' or '.join(sorted(data.tables_of(contender)))} rows; comparable "
                           f"runs: {_present(data)}")
    return contender, hist


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
        "devices": {"a": _devices(data, run_a_out) if run_a_out else None,
                    "b": _devices(data, contender)},
        "same_device_kind": run_a_out is None or same_device_kind(_devices(data, run_a_out),
                                                                  _devices(data, contender)),
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


# --- rendering ---------------------------------------------------------------------------------

CHANGE_TEXT = {"new_case_failure": "new case failing", "new_failure": "new failure",
               "fixed": "fixed", "budget_jump": "budget jump", "budget_drop": "budget drop",
               "still_failing": "still failing"}


def case_text(e: dict) -> str:
    return e["label"].split(":", 1)[-1] or e["case_id"]


def _runs_text(h: dict) -> str:
    """'1 of 10 runs', or '1-3 of 10 runs' when the series' histories differ."""
    lo, hi = h["min_runs"], h["max_runs"]
    return f"{lo if lo == hi else f'{lo}-{hi}'} of {h['needed']} runs"


def headline(report: dict) -> str:
    s = report["summary"]
    extra = [f"{s['not_judged']} not judged ({_runs_text(s['not_judged_history'])})"
             ] if s["not_judged"] else []
    extra += [f"{s[k]} {k}" for k in ("ambiguous", "accepted") if s[k]]
    for table, what, failing in (("correctness", "cases", "new_case_failure"),
                                 ("speed", "timings", "new_failed")):
        c = s[table]
        if c["new_cases"] or c["missing_cases"]:
            new = f"{c['new_cases']} new" + (f" ({c[failing]} failing)" if c[failing] else "")
            extra.append(f"{table}: {new}, {c['missing_cases']} missing {what}")
    return (f"{s['regressions']} regressions, {s['improvements']} improvements, "
            f"{s['unchanged']} unchanged" + "".join(f", {x}" for x in extra))


def against(report: dict, quote: str = "") -> str:
    """'B ... against A ...' (or against the history), run ids between `quote`s."""
    def q(run_id):
        return f"{quote}{run_id}{quote}"
    if report["mode"] == "pair":
        return f"B {q(report['run_b'])} against A {q(report['run_a'])}"
    runs = report["baseline_runs"]
    return (f"{q(report['run_b'])} against the history of {len(runs)} runs "
            f"({q(runs[0])} .. {q(runs[-1])})")


def _fmt(value, spec: str, none: str = "-") -> str:
    return format(value, spec) if value is not None else none


def _status_budget(status: str | None, budget) -> str:
    if status is None:
        return "- (no row)"
    return f"{status} ({budget:.3g})" if budget is not None else status


def _verdict_text(e: dict, needed: int | None) -> str:
    if e["verdict"] == "NOT_JUDGED":
        return f"NOT_JUDGED ({e['history_runs']} of {needed} runs)"
    return e["verdict"]


def _speed_change(e: dict) -> str:
    if e["ratio"] is None:
        return e["status_b"] if e["verdict"] in ("FAILED", "NOT_TIMED", "NEW_FAILED") else "-"
    text = f"{100 * (e['ratio'] - 1):+.1f}%"
    if e["ci_lo"] is not None:
        text += f" [{100 * (e['ci_lo'] - 1):+.1f}%, {100 * (e['ci_hi'] - 1):+.1f}%]"
    if e["z"] is not None:
        text += f" z {e['z']:.1f}"
    return text


def render_table(report: dict, console) -> None:
    """Rich tables (correctness changes, speed), then the one-line summary."""
    from rich.markup import escape
    from rich.table import Table

    colour = {"regression": "red", "improvement": "green", "ambiguous": "yellow",
              "not_judged": "yellow", "unchanged": "cyan"}
    console.print(escape(f"compare {against(report)}"))
    if not report["same_device_kind"]:
        console.print("[yellow]note: the runs are of different device kinds:[/] " + escape(
            f"A {report['devices']['a']}, B {report['devices']['b']}"))
    accepted = any(e["accepted_by"] for e in report["correctness"] + report["speed"])
    if report["correctness"]:
        t = Table(title="correctness changes")
        for col in ("impl", "case", "dtype", "change", "A", "B") + ("accepted",) * accepted:
            t.add_column(col, no_wrap=col in ("impl", "case"))
        for e in report["correctness"]:
            style = "dim" if e["accepted_by"] else colour[e["direction"]]
            t.add_row(e["impl"], escape(case_text(e)), e["dtype"],
                      f"[{style}]{CHANGE_TEXT[e['change']]}[/]",
                      _status_budget(e["status_a"], e["budget_a"]),
                      _status_budget(e["status_b"], e["budget_b"]),
                      *(escape(e["accepted_by"] or ""),) * accepted)
        console.print(t)
    if report["speed"]:
        pair = report["mode"] == "pair"
        t = Table(title="speed: median per call" + ("" if pair else ", history mean as A"))
        for col in ("impl", "case", "dtype", "mode", "A µs", "B µs", "B/A",
                    "95% CI" if pair else "z", "verdict") + ("accepted",) * accepted:
            t.add_column(col, justify="right" if col in ("A µs", "B µs", "B/A", "95% CI", "z")
                         else "left", no_wrap=col in ("impl", "case"))
        for e in report["speed"]:
            ci = (f"[{_fmt(e['ci_lo'], '.3f')}, {_fmt(e['ci_hi'], '.3f')}]"
                  if e["ci_lo"] is not None else "-") if pair else _fmt(e["z"], ".1f")
            style = "dim" if e["accepted_by"] else colour[e["direction"]]
            t.add_row(e["impl"], escape(case_text(e)), e["dtype"], e["mode"],
                      _fmt(e["median_a_ns"] and e["median_a_ns"] / 1e3, ".2f"),
                      _fmt(e["median_b_ns"] and e["median_b_ns"] / 1e3, ".2f"),
                      _fmt(e["ratio"], ".3f"), escape(ci),
                      f"[{style}]{_verdict_text(e, report['thresholds']['min_history'])}[/]",
                      *(escape(e["accepted_by"] or ""),) * accepted)
        console.print(t)
    style = "red" if report["regression"] else "green"
    console.print(f"[{style}]{escape(headline(report))}[/]")


def _budget_change_text(e: dict) -> str:
    if e["z"] is not None:
        return f"z {e['z']:.1f}"
    a, b = e["budget_a"], e["budget_b"]
    return f"budget x{b / a:.3g}" if a and b is not None else ""


def _md_rows(entries: list[dict], needed: int | None) -> list[str]:
    lines = ["| change | impl | case | dtype | mode | A | B | B vs A |",
             "|---|---|---|---|---|---|---|---|"]
    for e in entries:
        if "change" in e:
            cells = [CHANGE_TEXT[e["change"]], e["impl"], case_text(e), e["dtype"], "",
                     _status_budget(e["status_a"], e["budget_a"]),
                     _status_budget(e["status_b"], e["budget_b"]), _budget_change_text(e)]
        else:
            cells = [_verdict_text(e, needed), e["impl"], case_text(e), e["dtype"], e["mode"],
                     _fmt(e["median_a_ns"] and e["median_a_ns"] / 1e3, ".2f") + " µs",
                     _fmt(e["median_b_ns"] and e["median_b_ns"] / 1e3, ".2f") + " µs",
                     _speed_change(e)]
        if e["accepted_by"]:
            cells[0] += f" (accepted: {e['accepted_by']})"
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def render_markdown(report: dict) -> str:
    """A PR comment: headline, regressions, improvements, accepted changes, then the counts."""
    s = report["summary"]
    entries = report["correctness"] + report["speed"]
    title = (f"{s['regressions']} regression{'s' if s['regressions'] != 1 else ''}"
             if report["regression"] else "no regressions")
    th = report["thresholds"]
    out = [f"### kparity compare: {title}", "",
           f"{against(report, quote='`')}; min change {100 * th['min_change']:g} %, budget jump "
           f"{th['budget_jump']:g}x, z {th['z']:g}", ""]
    sections = (("Regressions", [e for e in entries if e["regression"]]),
                ("Improvements", [e for e in entries if e["direction"] == "improvement"]),
                ("Accepted", [e for e in entries if e["accepted_by"]
                              and e["direction"] == "regression"]))
    for name, rows in sections:
        if rows:
            out += [f"#### {name}", "", *_md_rows(rows, th["min_history"]), ""]
    out += ["#### Counts", "", f"**{headline(report)}**", ""]
    for table, name in (("correctness", "correctness"), ("bench", "speed")):
        if table in report["tables"]:
            out.append(f"- {name}: " + ", ".join(f"{v} {k.replace('_', ' ')}"
                                                 for k, v in s[name].items()))
    return "\n".join(out + [""])


def load_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())
