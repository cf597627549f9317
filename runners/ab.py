"""A/B of two impls of one op on one case: correctness of each, agreement, and a timing verdict.

1. Each arm against the oracle (as in `kparity check`; cases too large for the oracle are
   `skipped:size`), then A against B on the same inputs: max |A - B| and the max ULP distance.
   An arm that is wrong is not timed, and the A/B says so (status `fail`).
2. `runs` interleaved runs per arm (A B A B ...), each a full `bench_one` measurement with fresh
   buffers and a fresh graph, so the run-to-run effects (placement, clocks) land in the spread
   that the verdict sees. Every run is a `bench` row (ab_id, arm, rep).
3. The verdict from the run medians (`runners/abstats.py`): ratio B/A with a bootstrap 95 %
   interval, delta = max(2 %, 3 x the A/A noise), FASTER / SLOWER / SAME / AMBIGUOUS.
"""

from __future__ import annotations

import json
import secrets

import numpy as np

from cases.model import make_inputs
from gpu_impls.contract import ContractError
from oracle.dtypes import ulp_distance
from runners.abstats import compare_runs
from runners.bench import bench_one, correctness
from runners.correctness import run_impl


def agreement(impl_a, backend_a, impl_b, backend_b, case, host_inputs) -> tuple[float, int]:
    """(max |A - B|, max ULP distance) over every output, both run on the same inputs."""
    out_a = run_impl(impl_a, backend_a, case, host_inputs)
    out_b = run_impl(impl_b, backend_b, case, host_inputs)
    max_abs, max_ulp = 0.0, 0
    for t in case.spec.outputs:
        a, b = out_a[t.name], out_b[t.name]
        with np.errstate(invalid="ignore"):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = max(max_abs, float(np.nanmax(diff)) if diff.size else 0.0)
        if np.isnan(diff).any() and not np.array_equal(np.isnan(a.astype(np.float64)),
                                                       np.isnan(b.astype(np.float64))):
            max_abs = float("inf")
        max_ulp = max(max_ulp, int(np.max(ulp_distance(a, b, t.dtype(case)))))
    return max_abs, max_ulp


def ab_case(impl_a, backend_a, impl_b, backend_b, case, mode: str, runs: int, new_stop,
            ceilings: dict | None, run_id: str, on_row=None, progress=None) -> dict:
    """Run the A/B of `case`; `on_row(bench_row)` receives each run's row as it lands."""
    ab_id = secrets.token_hex(6)
    row = {"run_id": run_id, "ab_id": ab_id, "case_id": case.id, "impl_a": impl_a.id,
           "impl_b": impl_b.id, "op": case.op, "dtype": case.dtype,
           "dims": json.dumps(case.dims, sort_keys=True), "label": case.label, "mode": mode,
           "status": "error", "message": "", "runs_a_ns": [], "runs_b_ns": []}
    try:
        for arm, impl, backend in (("a", impl_a, backend_a), ("b", impl_b, backend_b)):
            status, _, msg = correctness(impl, backend, case)
            row[f"correct_{arm}"] = status
            if status in ("fail", "error"):
                row["status"] = "fail"
                row["message"] = f"{impl.id} not timed: {status} against the oracle ({msg})"
                return row
        host_inputs = make_inputs(case)
        row["ab_max_abs"], row["ab_max_ulp"] = agreement(impl_a, backend_a, impl_b, backend_b,
                                                         case, host_inputs)
        medians = {"A": [], "B": []}
        for rep in range(runs):
            for arm, impl, backend in (("A", impl_a, backend_a), ("B", impl_b, backend_b)):
                b = bench_one(impl, backend, case, mode, new_stop, ceilings, run_id,
                              host_inputs=host_inputs, verify=False, progress=progress)
                b.update({"ab_id": ab_id, "arm": arm, "rep": rep,
                          "correct": row[f"correct_{arm.lower()}"]})
                if on_row is not None:
                    on_row(b)
                if b["status"] != "ok":
                    row["status"] = "fail"
                    row["message"] = f"{impl.id} run {rep}: {b['status']}: {b['message']}"
                    return row
                medians[arm].append(b["median_ns"])
        row["runs_a_ns"], row["runs_b_ns"] = medians["A"], medians["B"]
        row.update(compare_runs(medians["A"], medians["B"]))
        row["status"] = "ok"
    except ContractError as e:
        row["status"] = "fail"
        row["message"] = str(e)
    except Exception as e:
        row["message"] = f"{type(e).__name__}: {e}"
    return row
