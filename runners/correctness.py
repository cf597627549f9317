"""Correctness: one impl on one case against the oracle, as one result row.

Order of events: contract check (before anything touches the device) -> inputs -> oracle ->
outputs allocated and poisoned with NaN -> launch -> copy back -> metrics per output. The row
keeps the worst output's metrics (by budget) and all outputs' metrics as JSON.

Status: `pass` (every output within its bound, no NaN/Inf mismatch), `fail`, `rejected` (the
contract refused the case before launch: expected for violating cases, a failure otherwise),
`error` (the impl raised). A violating case that launches is a `fail`.
"""

from __future__ import annotations

import json
import time
import traceback

import numpy as np

from cases.generate import Work
from cases.model import make_inputs
from gpu_impls.contract import ContractError
from oracle.dtypes import storage_dtype
from runners.metrics import compare

FAILING = ("fail", "error", "timeout", "crash")


def repro_command(impl_id: str, case_id: str) -> str:
    return f"kparity repro {case_id} --impl {impl_id}"


def run_impl(impl, backend, case, inputs: dict) -> dict[str, np.ndarray]:
    """Launch `impl` on host `inputs`; host outputs back. Raises ContractError before launch."""
    spec = case.spec
    launch = impl.contract.check(impl.id, case)
    dev_in = {k: backend.to_device(v) for k, v in inputs.items()}
    dev_out = None
    if backend.writes_in_place:
        dev_out = {t.name: backend.poisoned(t.shape(case.dims), t.dtype(case.dtype))
                   for t in spec.outputs}
    backend.synchronize()
    returned = impl.run(launch, dev_in, dev_out, case)
    backend.synchronize()
    produced = returned if returned is not None else dev_out
    if produced is None:
        raise RuntimeError(f"{impl.id} returned no outputs")
    out = {}
    for t in spec.outputs:
        if t.name not in produced:
            raise RuntimeError(f"{impl.id} did not produce output {t.name!r}")
        host = backend.to_host(produced[t.name], t.dtype(case.dtype))
        shape = t.shape(case.dims)
        if host.size != int(np.prod(shape)):
            raise RuntimeError(f"{impl.id}: output {t.name} has {host.size} elements, "
                               f"expected {int(np.prod(shape))} {shape}")
        out[t.name] = host.reshape(shape).astype(storage_dtype(t.dtype(case.dtype)), copy=False)
    return out


def nondeterministic_outputs(impl, backend, case, inputs: dict | None = None) -> list[str]:
    """Outputs whose bits differ between two runs on the same inputs (fresh buffers each run).
    An impl declaring `deterministic=True` must return []."""
    inputs = inputs if inputs is not None else make_inputs(case)
    first = run_impl(impl, backend, case, inputs)
    second = run_impl(impl, backend, case, inputs)
    return [name for name in first
            if first[name].tobytes() != second[name].tobytes()]


def check(work: Work, backend, run_id: str = "") -> dict:
    impl, case = work.impl, work.case
    spec = case.spec
    row = {
        "run_id": run_id, "case_id": case.id, "impl": impl.id, "op": case.op,
        "backend": impl.backend, "device": backend.device(), "dtype": case.dtype,
        "dist": case.dist, "dims": json.dumps(case.dims, sort_keys=True),
        "params": json.dumps(case.params, sort_keys=True), "label": case.label,
        "case_json": case.to_json(), "expect": work.expect, "status": "error", "message": "",
        "worst_output": "", "outputs_json": "{}",
        "max_abs": None, "max_rel": None, "nmse": None, "cosine": None, "max_ulp": None,
        "frac_within": None, "nonfinite_mismatch": None, "budget": None,
    }
    t0 = time.perf_counter()
    try:
        if work.expect == "rejected":
            impl.contract.check(impl.id, case)
            row["status"] = "fail"
            row["message"] = f"contract accepted a case that breaks `{work.invariant}`"
            return row
        inputs = make_inputs(case)
        oracle_case = case
        if backend.flushes_subnormals and "ftz" in spec.params:
            oracle_case = case.replace(ftz=1)  # the oracle under the backend's FTZ semantics
        exact, ref = spec.reference(inputs, oracle_case)
        bounds = spec.tolerance(inputs, exact, oracle_case)
        out = run_impl(impl, backend, case, inputs)
        per_output = {t.name: compare(out[t.name], ref[t.name], exact[t.name], bounds[t.name],
                                      t.dtype(case.dtype)) for t in spec.outputs}
        worst = max(per_output, key=lambda k: per_output[k]["budget"])
        m = per_output[worst]
        row.update({k: m[k] for k in ("max_abs", "max_rel", "nmse", "cosine", "max_ulp",
                                      "frac_within", "nonfinite_mismatch", "budget")})
        row["worst_output"] = worst
        row["outputs_json"] = json.dumps(per_output, sort_keys=True)
        ok = all(v["budget"] <= 1.0 and v["nonfinite_mismatch"] == 0 for v in per_output.values())
        row["status"] = "pass" if ok else "fail"
        if not ok:
            row["message"] = (f"{worst}[{m['worst_index']}] = {m['worst_out']:.9g}, oracle "
                              f"{m['worst_exact']:.9g}, bound {m['worst_bound']:.3g} "
                              f"(budget {m['budget']:.3g}, {m['nonfinite_mismatch']} NaN/Inf "
                              f"mismatches)")
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


def is_failure(row: dict) -> bool:
    if row["status"] == "rejected":
        return row["expect"] != "rejected"
    return row["status"] in FAILING
