"""A stored correctness row's verdict: whether it fails, the outcome `kparity check` counts it
as, and what it failed on. Pure functions of the row (no device, no oracle): the sweep
(`runners/correctness.py`), the result pages and comparisons (`results/`) and the verbs all
read a row's status through them, so they agree on what a failure is.
"""

from __future__ import annotations

import json

FAILING = ("fail", "error", "timeout", "crash", "xpass")  # xpass: a stale ledger entry


def repro_command(impl_id: str, case_id: str) -> str:
    return f"kparity repro {case_id} --impl {impl_id}"


def failure_kind(row: dict) -> str:
    """What a failing `fail` or `rejected` row failed on, for the summary: a guard or poison
    defect, a valid case rejected, a violating case launched, bits differing between repeats,
    or the kind its worst failing output's comparator named (`oracle/comparators.py`: "over
    bound", "NaN/Inf mismatch", "argmax flip", "exact mismatch", "top-k set mismatch", ...)."""
    flags = set(row["flags"].split(",")) if row["flags"] else set()
    stages = sorted(f.split(":", 1)[1] for f in flags if f.startswith("stage:"))
    if stages:  # a staged pipeline impl: which stage failed, then how
        return f"stage {'+'.join(stages)}: " + failure_kind(
            {**row, "flags": ",".join(f for f in flags if not f.startswith("stage:"))})
    for flag in ("oob_write", "outside_region", "unwritten"):
        if flag in flags:
            return flag
    if row["status"] == "rejected":
        return "valid case rejected"
    if row["expect"] == "rejected":
        return "violating case launched"
    if any(f.startswith("nondeterministic:") for f in flags):
        return "nondeterministic"  # flagged and failed: the impl declares determinism
    outputs = json.loads(row["outputs_json"] or "{}").values()
    failed = [m for m in outputs if "fail_kind" in m]
    if failed:
        return max(failed, key=lambda m: m["budget"])["fail_kind"]
    # rows stored before comparators named their failure kinds
    if row["nonfinite_mismatch"]:
        return "NaN/Inf mismatch"
    if any(m.get("argmax_fail") for m in outputs):
        return "argmax flip"
    return "over bound"


def outcome(row: dict) -> str:
    """The status as `kparity check` counts it: an expected rejection is `rejected ok` (a
    violating case refused, as it should be), an unexpected one stays `rejected` (a failure)."""
    if row["status"] == "rejected" and row["expect"] == "rejected":
        return "rejected ok"
    return row["status"]


def is_failure(row: dict) -> bool:
    if row["status"] == "rejected":
        return row["expect"] != "rejected"
    return row["status"] in FAILING
