"""One (impl, case) item of a sweep made into its row: `run_one`, the per-item path every executor
shares (serial, `--devices`, a Ray task): `--repeat` runs of a valid case, judged by the
known-issues ledger (`gpu_impls/known_issues.py`)."""

from __future__ import annotations

from cases.generate import Work
from gpu_impls import backend, known_issues
from runners import oracle_cache
from runners.correctness import judged_row, quarantined_row, repeated_row
from runners.verdicts import is_failure


def run_one(w: Work, run_id: str, run_case, repeat: int, ledger) -> dict:
    """One (impl, case)'s row: `repeat` runs of it (valid cases), judged by the known-issues
    ledger (`gpu_impls/known_issues.py`): a never-launch entry's case does not run at all."""
    entry = known_issues.find(w.impl.id, w.case, ledger) if w.expect == "valid" else None
    if entry is not None and entry.kind == "never-launch":
        return quarantined_row(w, backend(w.impl.backend).device(), run_id, entry)
    rows = [run_case(w, run_id)]
    if w.expect == "valid" and repeat > 1:
        while len(rows) < repeat and not is_failure(rows[-1]):  # a failed repeat decides
            rows.append(run_case(w, run_id))
        cached = rows[0].get(oracle_cache.CACHE_KEY)  # the first repeat's lookup speaks for it
        rows = [{k: v for k, v in r.items() if k != oracle_cache.CACHE_KEY} for r in rows]
        row = repeated_row(w.impl, rows, repeat)
        if cached is not None:
            row[oracle_cache.CACHE_KEY] = cached
    else:
        row = rows[0]
    return judged_row(row, entry) if entry is not None else row
