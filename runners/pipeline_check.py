"""Checking a staged pipeline impl: each stage on its predecessor's kernel output, then the chain.

For stage k = 1..K of the pipeline (`oracle/pipeline.py`), the stage's impl runs on the pipeline
inputs and the outputs the *impls* of the stages before it produced (host copies, as those
kernels stored them), and is checked as any impl of its op (`check_op`: its op's oracle and
bound on exactly those inputs, guards and poison). A wrong stage fails its own check; the stages
after it are judged on what they were given, so they do not inherit its error. Then the staged
impl runs the whole chain again (device arrays handed from stage to stage) against the pipeline
op's oracle, the exact composition, and its end-to-end bound.

One row per (staged impl, case). `outputs_json` holds every stage output as "<stage>.<output>"
and the pipeline's outputs under their own names; the metrics columns are the worst of them by
budget. Status: `pass` when every stage and the chain pass, else the first failing check's status
(stage order, then the chain); the message says "stage k (name): ..." for each failing stage
and "end to end: ..." for the chain; the flags add `stage:<name>` per failing stage,
`end_to_end` where the chain fails, and the failing checks' own flags (`oob_write`, ...).
"""

from __future__ import annotations

import json
import time
import traceback

from cases.generate import Work
from cases.model import make_inputs
from runners.rows import ROW_METRICS, base_row

CHAIN = "end_to_end"


def check_stages(work: Work, backend, run_id: str, check_op) -> dict:
    """The staged impl's row (module docstring); `check_op(work, backend, run_id, inputs=,
    keep=)` checks one op's impl on given inputs (`runners.correctness.check_op`, which hands
    itself in: this module sits below it)."""
    impl, case = work.impl, work.case
    t0 = time.perf_counter()
    try:
        if not impl.contract.admits(case):  # refused before anything launches: its row
            return check_op(work, backend, run_id)
        pipeline, stage_impls = impl.contract.resolve()
        inputs = make_inputs(case)
    except Exception as e:
        row = base_row(work, backend.device(), run_id)
        row["message"] = f"{type(e).__name__}: {e} | {traceback.format_exc(limit=3)[-400:]}"
        row["seconds"] = time.perf_counter() - t0
        return row
    values, parts = dict(inputs), []
    for k, stage in enumerate(pipeline.stages, 1):
        kept: dict = {}
        try:
            stage_in = pipeline.stage_inputs(stage, values, case)
        except (KeyError, ValueError) as e:  # a previous stage's output of the wrong shape
            parts.append((f"stage {k} ({stage.name})", stage.name,
                          {**base_row(work, backend.device(), run_id), "message": str(e)}))
            break
        sub = check_op(Work(stage_impls[stage.name], pipeline.stage_case(case, stage), "valid"),
                       backend, run_id, inputs=stage_in, keep=kept)
        parts.append((f"stage {k} ({stage.name})", stage.name, sub))
        if not kept:  # the stage raised: nothing to hand on
            break
        values.update({f"{stage.name}.{name}": v for name, v in kept.items()})
    if len(parts) < len(pipeline.stages):
        label, name, sub = parts[-1]
        parts[-1] = (label, name, {**sub, "message": sub["message"]
                                   + " (the stages after it were not checked)"})
    parts.append(("end to end", CHAIN, check_op(work, backend, run_id, inputs=inputs)))
    row = merged(parts)
    row["seconds"] = time.perf_counter() - t0
    return row


def merged(parts: list[tuple[str, str, dict]]) -> dict:
    """One row from the stages' rows and the chain's (the chain's row is the base: its case,
    impl and ids)."""
    row = dict(parts[-1][2])
    per_output = {}
    for _, name, sub in parts:
        for output, m in json.loads(sub.get("outputs_json") or "{}").items():
            per_output[output if name == CHAIN else f"{name}.{output}"] = m
    row["outputs_json"] = json.dumps(per_output, sort_keys=True)
    scored = {k: m for k, m in per_output.items() if m.get("budget") is not None}
    if scored:
        worst = max(scored, key=lambda k: scored[k]["budget"])
        row.update({k: scored[worst].get(k) for k in ROW_METRICS})
        row["worst_output"] = worst
    failing = [(label, name, sub) for label, name, sub in parts if sub["status"] != "pass"]
    flags = [f for f in parts[-1][2]["flags"].split(",") if f]
    for _, name, sub in failing:
        flags += [CHAIN if name == CHAIN else f"stage:{name}"]
        flags += [f for f in sub["flags"].split(",") if f]
    row["flags"] = ",".join(dict.fromkeys(flags))
    row["status"] = failing[0][2]["status"] if failing else "pass"
    row["message"] = "; ".join(f"{label}: {sub['message']}" for label, _, sub in failing)
    return row
