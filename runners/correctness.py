"""Correctness: one impl on one case against the oracle, as one result row.

Order of events: contract check (before anything touches the device) -> inputs -> oracle ->
outputs allocated, poisoned with NaN and fenced by guard regions -> launch -> copy back ->
guards and poison checked -> each output judged by its comparator (`oracle/comparators.py`).
The row keeps the worst output's metrics (by budget) and all outputs' metrics as JSON.

Status: `pass` (every output's comparator satisfied: by default within its bound, no NaN/Inf
mismatch; no guard element changed, no element left unwritten, an aliased output unchanged
outside the region the op writes), `fail` (flags `oob_write` / `unwritten` / `outside_region`
name those three), `rejected` (the contract refused the case before launch: expected for
violating cases, a failure otherwise), `error` (the impl raised). A violating case that launches
is a `fail`. Comparators add flags of their own (`near_tie:<output>`: a choice that differs from
the oracle's within the tolerance, recorded, not failed).
"""

from __future__ import annotations

import hashlib
import json
import time
import traceback

import numpy as np

from cases.generate import Work
from cases.model import make_inputs
from gpu_impls.backend import outside_region
from gpu_impls.contract import ContractError
from oracle.comparators import judge_outputs
from oracle.dtypes import storage_dtype
from runners.rows import ROW_METRICS, base_row
from runners.verdicts import is_failure



class OutputDefect(AssertionError):
    """An impl wrote outside its outputs or left elements of them unwritten."""


def run_impl(impl, backend, case, inputs: dict) -> dict[str, np.ndarray]:
    """Launch `impl` on host `inputs`; host outputs back. Raises ContractError before launch,
    OutputDefect after it when the impl wrote out of bounds or left an element unwritten."""
    out, defects = launch_impl(impl, backend, case, inputs)
    if defects:
        raise OutputDefect(f"{impl.id} on case {case.id}: "
                           + "; ".join(text for _, text in defects))
    return out


def launch_impl(impl, backend, case, inputs: dict
                ) -> tuple[dict[str, np.ndarray], list[tuple[str, str]]]:
    """(host outputs, defects as (flag, text)). On backends that write in place each output is
    poisoned and sits between guard regions (`Backend.guarded`); the defects name each output
    with out-of-bounds writes (guard elements changed) or unwritten elements (poison bits
    left), with their flat indices. An output aliasing an input (`TensorSpec.aliases`) is the
    input's own buffer, guarded, holding the input's values and poisoned only where the op
    writes (`OpSpec.written`); any element outside that region whose bits differ from the
    input's afterwards is an `outside_region` defect (on every backend). Raises ContractError
    before the launch."""
    spec = case.spec
    launch = impl.contract.check(impl.id, case)
    aliased = {t.aliases: t for t in spec.outputs if t.aliases}
    dev_in = {k: backend.to_device(v) for k, v in inputs.items() if k not in aliased}
    written = {t.name: spec.written(t.name, case, inputs) for t in aliased.values()}
    guarded = {}
    for t in spec.outputs:
        if t.aliases and backend.writes_in_place:  # the input's own buffer, poisoned where written
            poison = np.zeros_like(written[t.name]) if t.reads_written else written[t.name]
            guarded[t.name] = backend.guarded(t.shape_of(case), t.dtype(case),
                                              fill=inputs[t.aliases], poison=poison)
            dev_in[t.aliases] = guarded[t.name].array
        elif t.aliases:  # a functional backend returns the updated tensor
            dev_in[t.aliases] = backend.to_device(inputs[t.aliases])
        elif backend.writes_in_place:
            guarded[t.name] = backend.guarded(t.shape_of(case), t.dtype(case))
    backend.synchronize()
    returned = impl.run(launch, dev_in, {k: g.array for k, g in guarded.items()} or None, case)
    backend.synchronize()
    if returned is None and not guarded:
        raise RuntimeError(f"{impl.id} returned no outputs")
    out, defects = {}, []
    for t in spec.outputs:
        shape = t.shape_of(case)
        fenced = guarded.get(t.name)
        own = returned is not None and (
            fenced is None or not backend.same_memory(returned.get(t.name), fenced.array))
        if fenced is not None:
            host, found = fenced.read(backend)
            # an impl that returns its own array leaves the poisoned one alone: only its guards
            defects += [(flag, f"{t.name}: {text}") for flag, text in found
                        if not (own and flag == "unwritten")]
        if own:
            if t.name not in returned:
                raise RuntimeError(f"{impl.id} did not produce output {t.name!r}")
            host = backend.to_host(returned[t.name], t.dtype(case))
            if host.size != int(np.prod(shape)):
                raise RuntimeError(f"{impl.id}: output {t.name} has {host.size} elements, "
                                   f"expected {int(np.prod(shape))} {shape}")
        out[t.name] = host.reshape(shape).astype(storage_dtype(t.dtype(case)), copy=False)
        if t.aliases:  # everything the op does not write keeps the input's bits
            defects += [(flag, f"{t.name}: {text}") for flag, text in
                        outside_region(out[t.name], inputs[t.aliases], written[t.name])]
    return out, defects


def nondeterministic_outputs(impl, backend, case, inputs: dict | None = None) -> list[str]:
    """Outputs whose bits differ between two runs on the same inputs (fresh buffers each run).
    An impl declaring `deterministic=True` must return []."""
    inputs = inputs if inputs is not None else make_inputs(case)
    first = run_impl(impl, backend, case, inputs)
    second = run_impl(impl, backend, case, inputs)
    return [name for name in first
            if first[name].tobytes() != second[name].tobytes()]


def batch_variant_rows(impl, backend, case, inputs: dict | None = None) -> list[int]:
    """Rows i of the case's batch (`OpSpec.batch`) where the batch's output differs in any bit
    from `impl` run on row i alone (the batch dim set to 1, the batched inputs sliced to row i,
    the shared ones unchanged). An impl declaring `batch_invariant` must return []."""
    batch = case.spec.batch
    if batch is None:
        raise ValueError(f"op {case.op} declares no batch dim (OpSpec.batch)")
    inputs = inputs if inputs is not None else make_inputs(case)
    whole = run_impl(impl, backend, case, inputs)
    single = case.replace(**{batch.dim: 1})
    differ = []
    for i in range(case.dims[batch.dim]):
        row_inputs = {k: v[i:i + 1] if k in batch.inputs else v for k, v in inputs.items()}
        alone = run_impl(impl, backend, single, row_inputs)
        if any(whole[k][i:i + 1].tobytes() != alone[k].tobytes() for k in batch.outputs):
            differ.append(i)
    return differ


def check(work: Work, backend, run_id: str = "") -> dict:
    """One impl on one case: its result row. A staged pipeline impl (`Impl.stages`) is checked
    stage by stage and end to end (`runners.pipeline_check`)."""
    if work.impl.stages is not None and work.expect == "valid":
        from runners.pipeline_check import check_stages

        return check_stages(work, backend, run_id, check_op)
    return check_op(work, backend, run_id)


def check_op(work: Work, backend, run_id: str = "", inputs: dict | None = None,
             keep: dict | None = None) -> dict:
    """`check` on the case's own inputs, or on `inputs` (a pipeline stage runs on its
    predecessor's kernel output); `keep`, where given, receives the impl's host outputs."""
    impl, case = work.impl, work.case
    spec = case.spec
    row = base_row(work, backend.device(), run_id)
    t0 = time.perf_counter()
    try:
        if work.expect == "rejected":
            impl.contract.check(impl.id, case)
            row["status"] = "fail"
            row["message"] = f"contract accepted a case that breaks `{work.invariant}`"
            return row
        own_inputs = inputs is None
        inputs = make_inputs(case) if own_inputs else inputs
        exact, ref, bounds = oracle_for(impl, backend, case, inputs, own_inputs)
        out, defects = launch_impl(impl, backend, case, inputs)
        if keep is not None:
            keep.update(out)
        verdicts = judge_outputs(spec, case, inputs, out, exact, ref, bounds)
        per_output = {name: {**v.metrics, "digest": output_digest(out[name])}
                      for name, v in verdicts.items()}
        failed = {name: v for name, v in verdicts.items() if not v.ok}
        for name, v in failed.items():
            per_output[name]["fail_kind"] = v.kind
        # the worst output by budget; at a tie, one with element-wise metrics for the columns
        worst = max(per_output, key=lambda k: (per_output[k]["budget"],
                                               "max_abs" in per_output[k]))
        row.update({k: per_output[worst].get(k) for k in ROW_METRICS})
        row["worst_output"] = worst
        row["outputs_json"] = json.dumps(per_output, sort_keys=True)
        row["flags"] = ",".join(f"{flag}:{name}" for name, v in verdicts.items()
                                for flag in v.flags)
        row["status"] = "pass" if not failed and not defects else "fail"
        if defects:  # out-of-bounds writes and unwritten elements, with their indices
            for flag in sorted({flag for flag, _ in defects}):
                row["flags"] = _with_flag(row["flags"], flag)
        row["message"] = "; ".join([text for _, text in defects]
                                   + [v.message for v in failed.values()])
    except ContractError as e:
        row["status"] = "rejected"
        row["message"] = str(e)
        if work.expect != "rejected":
            row["message"] = "valid case rejected: " + str(e)
    except Exception as e:  # the impl is under suspicion: its exception is data
        row["status"] = "error"
        row["message"] = f"{type(e).__name__}: {e} | {traceback.format_exc(limit=3)[-400:]}"
    finally:
        row["seconds"] = time.perf_counter() - t0
    return row


def oracle_for(impl, backend, case, inputs: dict, own_inputs: bool = True
               ) -> tuple[dict, dict, dict]:
    """(exact, rounded reference, bounds) per output, as `impl` on `backend` is judged: under
    the backend's flush-to-zero semantics where it flushes subnormals, with the bounds of the
    impl's declared numerics. From the oracle cache where it holds them
    (`runners/oracle_cache.py`); `own_inputs`: `inputs` are `make_inputs(case)` (else, e.g. a
    pipeline stage's, their hash is part of the cache key)."""
    from runners.oracle_cache import reference_and_bounds

    return reference_and_bounds(case, inputs, impl.numerics_for(case),
                                ftz=backend.flushes_subnormals, own_inputs=own_inputs)[:3]


def output_digest(array: np.ndarray) -> str:
    """A short hash of an output's bytes: repeats of one case compare these (`--repeat`)."""
    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=8).hexdigest()


def repeated_row(impl, rows: list[dict], n: int) -> dict:
    """One row for `n` repeats of one case (`kparity check --repeat N`), from the rows of the
    repeats that ran (the runner stops at the first failing one): that failing repeat's row if
    any failed (a NaN in one repeat fails the case: it is a NaN/Inf mismatch there), else the
    first row, flagged `nondeterministic:<outputs>` where the outputs' bits differ between
    repeats, which fails the case when the impl declares determinism."""
    for k, row in enumerate(rows):
        if is_failure(row):
            return {**row, "message": f"repeat {k + 1} of {n}: {row['message']}",
                    "flags": _with_flag(row["flags"], f"repeats:{n}")}
    row = dict(rows[0])
    row["flags"] = _with_flag(row["flags"], f"repeats:{n}")
    if row["status"] != "pass":
        return row
    digests = [{k: v["digest"] for k, v in json.loads(r["outputs_json"]).items()} for r in rows]
    differ = sorted(k for k in digests[0] if len({d[k] for d in digests}) > 1)
    if differ:
        row["flags"] = _with_flag(row["flags"], f"nondeterministic:{'+'.join(differ)}")
        if impl.deterministic:
            row["status"] = "fail"
            row["message"] = (f"nondeterministic: {', '.join(differ)} differ in bits between "
                              f"{n} repeats on the same inputs; {impl.id} declares determinism")
    return row


def _with_flag(flags: str, flag: str) -> str:
    return f"{flags},{flag}" if flags else flag


def quarantined_row(work: Work, device: str, run_id: str, entry) -> dict:
    """The row of a case a never-launch ledger entry (`gpu_impls.known_issues`) keeps from
    running: `base_row`, status `quarantined`."""
    return {**base_row(work, device, run_id), "status": "quarantined",
            "flags": f"known:{entry.issue}", "seconds": 0.0,
            "message": f"not launched: {entry.describe()}, from {entry.source}"}


def judged_row(row: dict, entry) -> dict:
    """A case an xfail ledger entry covers, after it ran: `xfail` if it failed (any failing
    status, kept in the message), `xpass` if it passed (a failure: the entry is stale)."""
    flags = _with_flag(row["flags"], f"known:{entry.issue}")
    if is_failure(row):
        return {**row, "status": "xfail", "flags": flags,
                "message": f"{entry.describe()}: {row['status']}: {row['message']}"}
    return {**row, "status": "xpass", "flags": flags,
            "message": f"passes, but the ledger expects a failure: {entry.describe()}; the bug "
                       f"is fixed or the entry is too wide: remove or narrow it in "
                       f"{entry.source}"}
