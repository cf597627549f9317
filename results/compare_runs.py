"""Which runs `kparity compare` compares (`results/compare.py`'s docstring, "Which runs"): the
store's comparable rows passing the CLI filters, and the pair (A, B) or the contender and its
history, each of one device kind; `CompareError` where there is nothing to compare as asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from results.store import Store


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


def devices_of(data: StoreRows, run_id: str) -> dict:
    """The run's `devices` (backend -> device)."""
    return data.runs.get(run_id, {}).get("devices", {})


KINDS_SHOWN = 4  # kinds of runs an error message counts
RUN_IDS = 'kparity sql "SELECT run_id, verb FROM runs"'  # lists every run


def _present(data: StoreRows) -> str:
    """The comparable runs in a few words, for an error message's second line: how many of
    each kind (the verb, and the devices where runs differ in them), newest kind first, e.g.
    `runs here: 12 check, 1 bench`."""
    kinds: dict[tuple[str, str], list[str]] = {}
    for run_id in data.by_run:
        run = data.runs.get(run_id, {})
        devices = " + ".join(sorted(set(run.get("devices", {}).values())))
        kinds.setdefault((run.get("verb") or "?", devices), []).append(run_id)
    if not kinds:
        return "no runs here"
    many_devices = len({devices for _, devices in kinds}) > 1
    ordered = sorted(kinds.items(), key=lambda item: max(item[1]), reverse=True)
    shown = [f"{len(ids)} {verb}" + (f" on {devices or '?'}" if many_devices else "")
             for (verb, devices), ids in ordered[:KINDS_SHOWN]]
    more = f" and {len(ordered) - KINDS_SHOWN} more kinds" if len(ordered) > KINDS_SHOWN else ""
    return f"runs here: {', '.join(shown)}{more}"


def _kind(data: StoreRows, run_id: str) -> str:
    """A run's kind in a message: its verb (check, bench, ...)."""
    return data.runs.get(run_id, {}).get("verb") or "+".join(sorted(data.tables_of(run_id)))


def _check_run(data: StoreRows, run_id: str) -> None:
    if run_id not in data.by_run:
        valid = sorted(data.by_run)
        if run_id in data.runs:
            raise CompareError(f"run {run_id} has no correctness or plain bench rows (matching "
                               f"the filters)\n  {_present(data)} ({RUN_IDS})")
        raise CompareError(f"unknown run {run_id!r}", "run", run_id, valid)


def _peers(data: StoreRows, run_id: str, tables: set[str]) -> list[str]:
    """Comparable runs of run_id's device kind sharing an (impl, case) of one of `tables` with
    it, oldest first; repro runs are no one's peer."""
    mine = devices_of(data, run_id)
    return sorted(r for r in data.by_run if r != run_id and not data.is_repro(r)
                  and data.share_cases(r, run_id, tables)
                  and same_device_kind(mine, devices_of(data, r)))


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
            raise CompareError(f"no {_kind(data, run_a)} run after {run_a} of its device kind "
                               f"shares cases with it\n  {_present(data)} ({RUN_IDS})")
        return run_a, later[-1]
    newest = data.newest()
    if newest is None:
        raise CompareError("no runs with correctness or plain bench rows (matching the filters) "
                           "in the store, other than repro runs")
    earlier = [r for r in _peers(data, newest, data.tables_of(newest)) if r < newest]
    if not earlier:
        kind = _kind(data, newest)  # an earlier run of it shares no cases on this device kind
        raise CompareError(f"the newest run ({kind} {newest}) has no earlier {kind} run to "
                           f"compare with\n  {_present(data)}; name two: kparity compare RUN_A "
                           f"RUN_B ({RUN_IDS})")
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
                           f"{' or '.join(sorted(data.tables_of(contender)))} rows\n  "
                           f"{_present(data)} ({RUN_IDS})")
    return contender, hist
