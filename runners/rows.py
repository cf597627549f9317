"""A result row's skeleton: the columns every runner fills (`runners.correctness`,
`runners.pipeline_check`, process isolation's rows for a case that hung or crashed)."""

from __future__ import annotations

import json

# The row's metric columns, from its worst output (None where its comparator has no such metric).
ROW_METRICS = ("max_abs", "max_rel", "nmse", "cosine", "max_ulp", "frac_within",
               "nonfinite_mismatch", "budget")


def base_row(work, device: str, run_id: str = "") -> dict:
    """The row of `work` before anything ran: who ran which case, status `error`, no metrics.
    `check` fills it in; process isolation writes it as is for a case that hung or crashed."""
    impl, case = work.impl, work.case
    return {
        "run_id": run_id, "case_id": case.id, "impl": impl.id, "op": case.op,
        "backend": impl.backend, "device": device, "dtype": case.dtype,
        "dist": case.dist, "dims": json.dumps(case.dims, sort_keys=True),
        "params": json.dumps(case.params, sort_keys=True), "label": case.label,
        "case_json": case.to_json(), "expect": work.expect, "status": "error", "message": "",
        "worst_output": "", "outputs_json": "{}",
        "max_abs": None, "max_rel": None, "nmse": None, "cosine": None, "max_ulp": None,
        "frac_within": None, "nonfinite_mismatch": None, "budget": None, "flags": "",
    }
