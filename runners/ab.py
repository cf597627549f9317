"""A/B of impls of one op on one case: correctness of each, agreement, and a timing verdict.

`kparity ab A B [C ...]`: A is the baseline, every other impl is compared with it.

1. Each arm against the oracle (as in `kparity check`; cases too large for the oracle are
   `skipped:size`), then A against each other arm on the same inputs: max |A - X| and the max
   ULP distance. An arm that is wrong is not timed, and its A/B says so (status `fail`).
2. `runs` interleaved runs per arm (A B A B ..., or A B C A B C ... with more impls), each a
   full `bench_one` measurement with fresh buffers and a fresh graph, so the run-to-run effects
   (placement, clocks) land in the spread that the verdict sees. Every run is a `bench` row
   (ab_id: one per case, shared by its pairs; arm: the impl's letter, A the baseline; rep).
3. One `ab` row per (baseline, other impl) pair: the verdict from the run medians
   (`runners/abstats.py`): ratio X/A with a bootstrap 95 % interval, delta = max(2 %, 3 x the
   A/A noise), FASTER / SLOWER / SAME / AMBIGUOUS. The baseline's runs serve every pair.
"""

from __future__ import annotations

import json
import secrets

import numpy as np

from cases.generate import convention
from cases.model import make_inputs
from gpu_impls.contract import ContractError
from oracle.dtypes import FLOAT_FORMATS, ulp_distance
from runners.abstats import compare_runs
from runners.bench import bench_one, correctness, uncaptured_note
from runners.correctness import run_impl


def agreement(impl_a, backend_a, impl_b, backend_b, case, host_inputs,
              case_b=None) -> tuple[float, int]:
    """(max |A - B|, max ULP distance) over every output, both run on the same inputs (B on
    `case_b`, `case` under B's rounding convention, where given); an integer output's distance
    is |A - B| itself."""
    out_a = run_impl(impl_a, backend_a, case, host_inputs)
    out_b = run_impl(impl_b, backend_b, case_b or case, host_inputs)
    max_abs, max_ulp = 0.0, 0
    for t in case.spec.outputs:
        a, b = out_a[t.name], out_b[t.name]
        with np.errstate(invalid="ignore"):
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        max_abs = max(max_abs, float(np.nanmax(diff)) if diff.size else 0.0)
        if np.isnan(diff).any() and not np.array_equal(np.isnan(a.astype(np.float64)),
                                                       np.isnan(b.astype(np.float64))):
            max_abs = float("inf")
        if t.dtype(case) in FLOAT_FORMATS:
            steps = ulp_distance(a, b, t.dtype(case))
        else:  # integer outputs (ids, offsets): the values apart are the representable steps
            steps = np.abs(a.astype(np.int64) - b.astype(np.int64))
        max_ulp = max(max_ulp, int(np.max(steps)) if steps.size else 0)
    return max_abs, max_ulp


def _row(run_id: str, ab_id: str, case, mode: str, impl_a, impl_b, case_b) -> dict:
    return {"run_id": run_id, "ab_id": ab_id, "case_id": case.id, "impl_a": impl_a.id,
            "impl_b": impl_b.id, "op": case.op, "dtype": case.dtype,
            "dims": json.dumps(case.dims, sort_keys=True), "label": case.label, "mode": mode,
            "convention_a": convention(case), "convention_b": convention(case_b),
            "status": "error", "message": "", "runs_a_ns": [], "runs_b_ns": []}


def ab_group(arms: list, case, mode: str, runs: int, new_stop, ceilings: dict, run_id: str,
             on_row=None, progress=None, verify: bool = True) -> list[dict]:
    """The A/B of the baseline `arms[0]` against each other arm on `case`: one `ab` row per
    other arm, in order. `arms`: (letter, impl, backend, the arm's case), the letter each run's
    bench row carries as its `arm`; an arm's case is `case` under a rounding convention the arm
    admits (`cases.generate.admitted_variant`): every arm runs on `case`'s inputs, and the rows
    say each arm's convention. `ceilings`: backend name -> its ceilings row; `on_row(bench_row)`
    receives each run's row as it lands. An arm that fails (wrong, or a run not ok) ends its
    own pair; a failing baseline ends every pair. `verify=False` (`kparity ab --no-verify`)
    skips the oracle check of each arm (`correct` is then `unverified`): for cases whose float64
    oracle takes minutes; A against the others on the same inputs still runs."""
    ab_id = secrets.token_hex(6)
    cases = {letter: arm_case for letter, _, _, arm_case in arms}
    arms = [(letter, impl, backend) for letter, impl, backend, _ in arms]
    (base, impl_a, backend_a), others = arms[0], arms[1:]
    rows = {letter: _row(run_id, ab_id, cases[base], mode, impl_a, impl, cases[letter])
            for letter, impl, _ in others}
    live = list(arms)

    def end(letter: str, status: str, message: str) -> None:
        """Close the pair of `letter` (the baseline: every pair still open)."""
        for other in ([x for x, _, _ in live[1:]] if letter == base else [letter]):
            rows[other].update(status=status, message=message)
        live[:] = [live[0]] if letter == base else [a for a in live if a[0] != letter]
    try:
        correct = {}
        for letter, impl, backend in arms:
            if len(live) < 2:  # the baseline failed: nothing left to compare
                break
            status, _, msg = (correctness(impl, backend, cases[letter]) if verify
                              else ("unverified", None, ""))
            correct[letter] = status
            if status in ("fail", "error"):
                end(letter, "fail", f"{impl.id} not timed: {status} against the oracle ({msg})")
        for letter, row in rows.items():
            row["correct_a"], row["correct_b"] = correct.get(base), correct.get(letter)
        if len(live) < 2:
            return list(rows.values())
        host_inputs = make_inputs(cases[base])
        for letter, impl, backend in live[1:]:
            rows[letter]["ab_max_abs"], rows[letter]["ab_max_ulp"] = agreement(
                impl_a, backend_a, impl, backend, cases[base], host_inputs, cases[letter])
        medians = {letter: [] for letter, _, _ in live}
        for rep in range(runs):
            for letter, impl, backend in list(live):
                if len(live) < 2:
                    break
                b = bench_one(impl, backend, cases[letter], mode, new_stop,
                              ceilings.get(impl.backend),
                              run_id, host_inputs=host_inputs, verify=False, progress=progress)
                b.update({"ab_id": ab_id, "arm": letter, "rep": rep, "correct": correct[letter]})
                if on_row is not None:
                    on_row(b)
                if b["status"] != "ok":
                    end(letter, "fail", f"{impl.id} run {rep}: {b['status']}: {b['message']}")
                    continue
                medians[letter].append(b["median_ns"])
        for letter, impl, _ in live[1:]:
            row = rows[letter]
            row["runs_a_ns"], row["runs_b_ns"] = medians[base], medians[letter]
            row.update(compare_runs(medians[base], medians[letter]))
            row["status"] = "ok"
            row["message"] = "; ".join(f"{arm.id}: {note}" for arm in (impl_a, impl)
                                       if (note := uncaptured_note(arm, mode)))
    except ContractError as e:
        for letter, _, _ in live[1:]:
            rows[letter].update(status="fail", message=str(e))
    except Exception as e:
        for letter, _, _ in live[1:]:
            rows[letter]["message"] = f"{type(e).__name__}: {e}"
    return list(rows.values())
