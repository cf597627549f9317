"""Timing of one impl on one case in one mode, as one `bench` row; the run's `ceilings` row.

Order of events: contract check (before anything touches the device) -> correctness against the
oracle on the same case (a wrong kernel is never timed; cases too large for a float64 oracle in
reasonable time are marked `skipped:size`, and are covered at gate shapes by `kparity check`
and, in an A/B, by A against B) -> k rotating input sets uploaded (fresh allocations every
run) -> in `chain`, each set's predecessor on the op's chain input (`Timer.predecessor`) ->
`runners.timing.measure` -> the work model -> with `copy_same`, the size-matched copy.

Work model (`OpSpec.bytes`, `OpSpec.flops`): GB/s = bytes / median, TFLOP/s = flops / median,
% of the spec peak (2 x memory clock x bus width / 8, NVML) and % of the copy ceiling measured in
the same run. Above 100 % of the peak (of the copy ceiling where the spec is unknown) the data
must have come from a cache: the row is flagged `cache_resident`.

The size-matched copy (`copy_same`, `kparity bench --copy-same-bytes`): the run's copy ceiling
is a 1 GiB copy, which amortises the launch and the memory latency away; a decode kernel moving
100 KB cannot, and no kernel of its size can reach it. So the timer's copy kernel moving the
row's `bytes_model` (half read, half written), over as many rotating sets and in the same mode
(in `chain` after the same predecessor on its source), is timed right after the impl:
`copy_same_ns`, and `pct_copy_same` = 100 x copy_same_ns / median_ns, the share of the best
time of any kernel that must move these bytes. Both ceilings stay in the row: the small-size
one says how close a kernel is to what its size allows, the large one what the size costs.
"""

from __future__ import annotations

import gc
import json
import time
import traceback
from contextlib import nullcontext
from functools import partial

import numpy as np

from cases.generate import Work
from cases.model import make_inputs
from gpu_impls.contract import ContractError
from runners.abstats import summarize
from runners.correctness import check
from runners.timing import UNCAPTURED_SETS, measure, rotation_sets

# The oracle check before timing runs up to this many elements over all inputs and outputs
# (about 2.5 s of float64 NumPy per impl and case on one core); larger cases are `skipped:size`.
CHECK_MAX_ELEMS = 1 << 25


def elements(case) -> int:
    spec = case.spec
    return sum(int(np.prod(t.shape_of(case))) for t in spec.inputs + spec.outputs)


def correctness(impl, backend, case,
                check_max_elems: int = CHECK_MAX_ELEMS) -> tuple[str, float | None, str]:
    """(pass | fail | error | skipped:size | report, budget, message) of the oracle check before
    timing; `report` for a report-only speed baseline (`Impl.report_only`), whatever it got."""
    if elements(case) > check_max_elems:
        return "skipped:size", None, ""
    row = check(Work(impl, case, "valid"), backend)
    status = row["status"] if row["status"] in ("pass", "fail") else "error"
    if impl.report_only and status != "error":
        return "report", row["budget"], f"{status} (report only: {impl.report_only})"
    return status, row["budget"], row["message"]


def ceilings_row(run_id: str, backend_name: str, backend) -> dict:
    timer = backend.timer()
    ctx = timer.context()
    c = timer.ceilings()
    return {"run_id": run_id, "backend": backend_name, "device": backend.device(),
            "timer": timer.kind, "copy_bytes": c["copy_bytes"], "copy_gbps": c["copy_gbps"],
            "gemm": c["gemm"], "gemm_tflops": c["gemm_tflops"],
            "peak_bw_spec_gbps": ctx.get("peak_bw_spec_gbps"),
            "cache_bytes": timer.cache_bytes(), "ecc": ctx.get("ecc"),
            "driver": ctx.get("driver"), "sm_clock_default_mhz": ctx.get("sm_clock_default_mhz"),
            "context": json.dumps(ctx, sort_keys=True, default=str)}


def bench_base_row(impl, backend, case, mode, run_id) -> dict:
    return {"run_id": run_id, "case_id": case.id, "impl": impl.id, "op": case.op,
            "backend": impl.backend, "device": backend.device(), "dtype": case.dtype,
            "dist": case.dist, "dims": json.dumps(case.dims, sort_keys=True),
            "params": json.dumps(case.params, sort_keys=True), "label": case.label,
            "case_json": case.to_json(), "mode": mode, "timer": backend.timer().kind,
            "status": "error", "message": "", "ab_id": "", "arm": "", "rep": 0,
            "correct": "", "budget": None, "samples_ns": [],
            "bytes_model": int(case.spec.bytes(case)), "flops_model": int(case.spec.flops(case))}


def _input_sets(impl, backend, case, host_inputs: dict, k: int) -> list:
    """k independent device copies of the inputs, each with its own (poisoned) outputs."""
    sets = []
    for _ in range(k):
        ins = {name: backend.to_device(v) for name, v in host_inputs.items()}
        outs = None
        if backend.writes_in_place:  # an output aliasing an input is that input's buffer
            outs = {t.name: ins[t.aliases] if t.aliases else
                    backend.poisoned(t.shape_of(case), t.dtype(case))
                    for t in case.spec.outputs}
        sets.append((ins, outs))
    backend.synchronize()
    return sets


class _SetCall:
    """The call of one rotating set. An impl that returns fresh outputs (torch baselines, MLX)
    has them kept alive here until this set's next call, so that each of the k sets writes its
    own output memory, as an impl writing into the set's preallocated outputs does. Otherwise
    the allocator hands every call the block the previous call just freed: one L2-resident,
    TLB-warm output shared by all k sets, an advantage no in-place impl gets (measured on an
    H100 at 1024 heads x 128: see benchmarks/HISTORY.md, 44cd475)."""

    def __init__(self, run):
        self.run = run
        self.last = None

    def __call__(self):
        self.last = None  # free this set's previous outputs first: the new ones may reuse them
        self.last = self.run()
        return self.last


def work_model(row: dict, median_s: float, ceilings: dict | None) -> None:
    row["gbps"] = row["bytes_model"] / median_s / 1e9
    row["tflops"] = row["flops_model"] / median_s / 1e12
    peak = (ceilings or {}).get("peak_bw_spec_gbps")
    copy = (ceilings or {}).get("copy_gbps")
    row["pct_peak_spec"] = 100 * row["gbps"] / peak if peak else None
    row["pct_copy_ceiling"] = 100 * row["gbps"] / copy if copy else None
    limit = peak or copy
    row["cache_resident"] = bool(limit and row["gbps"] > limit)


def timed_mode(mode: str, spec) -> tuple[str, str]:
    """(the mode a case of op `spec` is timed in, why it is not `mode`, or ""): `chain` needs
    the op's chain input (`OpSpec.chain_input`); an op that declares none is timed in
    `graph_rot`, and the row's message says so."""
    if mode == "chain" and not spec.chain_input:
        return "graph_rot", (f"op {spec.name} declares no chain input (OpSpec.chain_input: the "
                             "input the op before it writes), so chain cannot time it: timed "
                             "in graph_rot (back-to-back calls of the impl itself)")
    return mode, ""


GRAPH_MODES = ("chain", "graph_rot")  # the modes that capture the calls in a CUDA graph


def uncaptured_note(impl, mode: str) -> str:
    """The row's note where `impl` is timed uncaptured (`Impl.host_sync`), else ""."""
    if not impl.host_sync or mode not in GRAPH_MODES:
        return ""
    return (f"timed uncaptured: {impl.host_sync}, so no CUDA graph can hold a call; each call "
            f"launched from Python (its host wait included), at most {UNCAPTURED_SETS} "
            "rotating sets")


def capture_hint(impl, error: Exception, mode: str) -> str:
    """The fix, where capturing an undeclared impl's calls in a graph failed."""
    if impl.host_sync or mode not in GRAPH_MODES or "captur" not in str(error).lower():
        return ""
    return (f"{impl.id} could not be captured in a CUDA graph (does a call read device data on "
            "the host?): declare it with Impl(host_sync='why') and chain / graph_rot time it "
            "uncaptured. ")


def copy_same_ns(timer, mode: str, nbytes: int, k: int, new_stop,
                 capture: bool = True) -> float | None:
    """Median ns per call of the timer's copy of `nbytes` over k rotating sets in `mode` (module
    docstring); None where the timer has none or the chain subtraction left nothing."""
    try:
        pairs = timer.copy_calls(nbytes, k)
    except NotImplementedError:
        return None
    calls = [call for call, _ in pairs]
    before = [timer.predecessor(src) for _, src in pairs] if mode == "chain" else None
    m = measure(timer, mode, calls, new_stop(), before=before, capture=capture)
    pairs = calls = before = None
    if not m.samples_s:
        return None
    median = summarize(m.samples_s)["median"]
    return median * 1e9 if median > 0 else None


def bench_one(impl, backend, case, mode: str, new_stop, ceilings: dict | None = None,
              run_id: str = "", host_inputs: dict | None = None, verify: bool = True,
              progress=None, copy_same: bool = False, hold=None) -> dict:
    """One measurement of `impl` on `case` in `mode`; never raises (errors are rows).
    `hold`: a lock held while it measures (`bench --devices`: one device at a time), else none.
    `new_stop()` makes the measurement's stopping rule (a fresh `runners.stopping.StdRel`).
    `chain` rewrites each set's chain input before its call (`timed_mode` for an op without).
    `copy_same`: the size-matched copy after it (module docstring)."""
    mode, fallback = timed_mode(mode, case.spec)
    row = bench_base_row(impl, backend, case, mode, run_id)
    row["message"] = "; ".join(m for m in (fallback, uncaptured_note(impl, mode)) if m)
    capture = not (impl.host_sync and mode in GRAPH_MODES)
    t0 = time.perf_counter()
    sets = calls = None
    try:
        launch = impl.contract.check(impl.id, case)
        if verify:
            row["correct"], row["budget"], msg = correctness(impl, backend, case)
            if row["correct"] in ("fail", "error"):
                row["status"] = "fail"
                row["message"] = f"not timed: wrong results against the oracle ({msg})"
                return row
        timer = backend.timer()
        host_inputs = host_inputs if host_inputs is not None else make_inputs(case)
        k = rotation_sets(row["bytes_model"], timer) if mode not in ("cold", "eager") else 1
        k = k if capture else min(k, UNCAPTURED_SETS)
        sets = _input_sets(impl, backend, case, host_inputs, k)
        calls = [_SetCall(partial(impl.run, launch, ins, outs, case)) for ins, outs in sets]
        before = ([timer.predecessor(ins[case.spec.chain_input]) for ins, _ in sets]
                  if mode == "chain" else None)
        with hold or nullcontext():
            m = measure(timer, mode, calls, new_stop(), progress=progress, before=before,
                        capture=capture)
        row.update({"n_sets": m.n_sets, "calls_per_sample": m.calls_per_sample,
                    "n_warmup": m.n_warmup, "warmup_s": m.warmup_s,
                    "n_samples": len(m.samples_s), "n_dropped": m.n_dropped,
                    "stop_reason": m.stop_reason,
                    "samples_ns": [float(s * 1e9) for s in m.samples_s],
                    "sm_clock_mhz": m.sm_clock_mhz, "mem_clock_mhz": m.mem_clock_mhz})
        if not m.samples_s:
            row["message"] = f"no samples kept: {m.n_dropped} dropped under the throttle floor"
            return row
        s = summarize(m.samples_s)
        if m.pred_samples_s:
            row["pred_median_ns"] = summarize(m.pred_samples_s)["median"] * 1e9
        if s["median"] <= 0:  # chain: the call added nothing measurable to its predecessor
            row["message"] = (f"{mode}: median per call {s['median'] * 1e9:.3g} ns is not "
                              "positive (the call's time is within the subtraction's noise)")
            return row
        row.update({"median_ns": s["median"] * 1e9, "mean_ns": s["mean"] * 1e9,
                    "min_ns": s["min"] * 1e9, "q1_ns": s["q1"] * 1e9, "q3_ns": s["q3"] * 1e9,
                    "rel_iqr": s["rel_iqr"], "rel_std": s["rel_std"]})
        work_model(row, s["median"], ceilings)
        row["status"] = "ok"
        if copy_same:
            sets = calls = None  # the impl's sets freed before the copy allocates its own
            gc.collect()
            with hold or nullcontext():
                row["copy_same_ns"] = copy_same_ns(timer, mode, row["bytes_model"], k,
                                                   new_stop, capture)  # launched as the impl was
            if row["copy_same_ns"] is not None:
                row["pct_copy_same"] = 100 * row["copy_same_ns"] / row["median_ns"]
    except ContractError as e:
        row["status"] = "rejected"
        row["message"] = str(e)
    except Exception as e:  # the impl (or the device) is under suspicion: the error is data
        row["status"] = "error"
        row["message"] = (f"{capture_hint(impl, e, mode)}{type(e).__name__}: {e} | "
                          f"{traceback.format_exc(limit=3)[-400:]}")
    finally:
        sets = calls = None
        gc.collect()  # free the rotating sets before the next measurement allocates its own
        row["seconds"] = time.perf_counter() - t0
    return row
