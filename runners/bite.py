"""The bite audit (`kparity bite`, issue 49 item 2): does the gate catch generic planted mistakes?

For each op, one correct reference impl (`reference_impl`: the first available builtin impl of
the op that is neither report-only, staged nor a mutant, torch before mlx; for an op only a
plugin registers, the plugin's impl likewise) is wrapped in a planted mistake applied to its
outputs after it ran (`planted`), and the wrapped impl is checked against the oracle
(`runners.correctness.check`) over the op's commit-tier valid cases. A case the unmutated impl
does not pass is left out (counted `baseline`: a mistake caught there says nothing). The
mistakes (`MISTAKES`), each applied to every output it fits:

    scale4, scale16  every element times (1 + k eps_T), rounded to T (T: the output's own dtype,
                     f32 / f16 / bf16 outputs only)
    ulp2             the element of largest |value| moved 2 ULPs of T away from zero (towards
                     zero where that would overflow); f32 / f16 / bf16 outputs only
    zero_row         row 0 (the leading axis, the output seen as [rows, -1]) set to zero bits
    zeros            every output all zero bits (a kernel that wrote nothing to a zeroed buffer)
    swap_rows        rows 0 and 1 swapped (outputs of at least two rows)

and four that need to know the op (`RUN_MISTAKES`: each edits what the impl reads, or the
state it writes, through the op's spec):

    eps_x10          the impl run with the case's `eps` param times 10 (ops with an eps)
    code_pm1         bit 0 of the first word or byte of each packed-code input flipped: its first
                     quant code off by one (inputs with init "codes", and FP4's `codes`)
    drop_last_term   the chain input's last element along its last axis zeroed: a loop one
                     short, so a reduction over that axis (a GEMV's dot, a norm's sum of squares,
                     attention's q.k) loses its last term (elementwise ops: their last column;
                     n/a where that element is already zero, e.g. gdn_solve_tril's strictly
                     lower-triangular A)
    stale_state      each state output (its name holds "state") left as the state input of the
                     same shape (`state_in`, `h0`, `conv_state_in`): the update not written

A case where the mistake fits no output is not counted for it ("n/a"); a case where it fits but
changes no bit (e.g. row 0 already zero) is counted, and passes: the audit reports what the
gate would see.

A case that passes the `zeros` mistake although the mistake changed its outputs admits the
all-zero output where the exact answer is not zero: `zero_admitting` lists such cases over the
gate's cases straight from the oracle (no impl), and the audit names them per op.

An (op, mistake) whose every counted case passes is *uncaught*, unless `ADMITTED[op][mistake]`
says why the op's contract admits it; `kparity bite` exits 1 when some is uncaught.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from oracle.dtypes import FLOAT_DTYPES, from_ordered, eps, ordered_bits, round_to, storage_dtype

PREFERRED_BACKENDS = ("torch", "mlx")  # the CPU backends here, in order of preference


# {op: {mistake: why the op's contract admits it}}: an uncaught mistake listed here does not
# fail the audit. Each entry needs a reason from the op's tolerance (found by `kparity bite
# --backend torch`: these passed every commit-tier case, and the bound says why).
ADMITTED: dict[str, dict[str, str]] = {
    "gdn_chunk_cumsum": {
        "ulp2": "gc is f32 and its bound is the any-order prefix sum's (i/2) u sum|g_m| "
                "(CUMSUM_DOC, oracle/gdn_chunked.py) >= (i/2) u |gc_i|: 2 ULP <= 4 u |gc_i| is "
                "inside it from the 8th token of a chunk on"},
    "gdn_solve_tril": {
        "drop_last_term": "the op reads only A's strictly lower triangle (SOLVE_DOC, "
                          "oracle/gdn_chunked.py), whose last column is empty: zeroing the "
                          "chain input's last column changes nothing it reads"},
    "gdn_kkt": {
        "scale4": "A is f32; its bound holds the K-term dot in any order ((K/2) u sum|k_i k_j|, "
                  "K >= 16) and k_i beta_i held in T (u_T) (KKT_DOC, oracle/gdn_chunked.py): "
                  "4 eps_f32 = 8 u relative is inside it"},
    "gdn_chunked": {
        "ulp2": "the end-to-end bound B (Hoeffding over every stage's T and f32 roundings, "
                "lambda ~ 6.6-8.6; CHUNKED_DOC, oracle/gdn_chunked.py) spans many ULPs of T: "
                "with the mistake planted the worst output stays at budget <= 0.35"},
    "moe_router": {
        "scale4": "weights are f32, judged over score intervals of 2 p (|d_i| + max|d| + E + 5) u "
                  "each (softmax; sigmoid 8 u s) plus (k + 2) u (oracle/moe_route.py): >= 16 u "
                  "= 8 eps relative, wider than 4 eps",
        "ulp2": "the same weights bound (oracle/moe_route.py): >= 8 eps relative at every "
                "weight, wider than 2 ULP"},
}


# --- the mistakes: (host output, its dtype name) -> the mistaken copy, or None (does not fit) --

def _rows(host: np.ndarray) -> int:
    return 1 if host.ndim == 0 else host.shape[0]


def scale(k: int) -> Callable[[np.ndarray, str], np.ndarray | None]:
    def mistake(host: np.ndarray, dtype: str) -> np.ndarray | None:
        if dtype not in FLOAT_DTYPES or host.size == 0:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            return round_to(host.astype(np.float64) * (1.0 + k * eps(dtype)), dtype)
    mistake.__name__ = f"scale{k}"
    return mistake


def ulp2(host: np.ndarray, dtype: str) -> np.ndarray | None:
    if dtype not in FLOAT_DTYPES or host.size == 0:
        return None
    flat = np.array(host, copy=True).reshape(-1)
    mag = np.abs(flat.astype(np.float64))
    mag[~np.isfinite(mag)] = -1.0
    i = int(np.argmax(mag))
    if mag[i] < 0:  # no finite element
        return None
    o = ordered_bits(flat[i:i + 1], dtype)
    away = 2 if float(flat[i]) >= 0 else -2
    with np.errstate(over="ignore", invalid="ignore"):
        moved = from_ordered(o + away, dtype)
        if not np.isfinite(moved).all():
            moved = from_ordered(o - away, dtype)
    flat[i] = round_to(moved, dtype)[0]
    return flat.reshape(host.shape)


def zero_row(host: np.ndarray, dtype: str) -> np.ndarray | None:
    if host.size == 0:
        return None
    out = np.array(host, copy=True)
    out.reshape(_rows(out), -1).view(np.uint8)[0] = 0  # zero bits: +0.0, code 0
    return out


def zeros(host: np.ndarray, dtype: str) -> np.ndarray | None:
    if host.size == 0:
        return None
    return np.zeros_like(host)  # zero bits in every storage dtype: +0.0, code 0


def swap_rows(host: np.ndarray, dtype: str) -> np.ndarray | None:
    if host.size == 0 or _rows(host) < 2:
        return None
    out = np.array(host, copy=True)
    out[[0, 1]] = out[[1, 0]]
    return out


MISTAKES: dict[str, Callable[[np.ndarray, str], np.ndarray | None]] = {
    "scale4": scale(4),
    "scale16": scale(16),
    "ulp2": ulp2,
    "zero_row": zero_row,
    "zeros": zeros,
    "swap_rows": swap_rows,
}


# --- mistakes that need the op: edits of the case or the inputs before the run, or of the state
# after it. Each takes (case, host inputs {name: array}) and returns (case, edited inputs) or None
# (does not fit); `stale_state` returns the outputs to replace after the run instead.

STATE_INPUTS = ("state_in", "h0", "conv_state_in")


def eps_x10(case, host: dict):
    if "eps" not in case.spec.params:
        return None
    return case.replace(eps=float(case.params["eps"]) * 10), {}


def code_pm1(case, host: dict):
    names = [t.name for t in case.spec.inputs
             if (t.init == "codes" or t.name == "codes") and host[t.name].size]
    if not names:
        return None
    edited = {}
    for name in names:
        a = np.array(host[name], copy=True)
        a.reshape(-1)[:1] ^= 1  # the first code's lowest bit: that code +- 1
        edited[name] = a
    return case, edited


def drop_last_term(case, host: dict):
    name = case.spec.chain_input
    a = host.get(name)
    spec = next((t for t in case.spec.inputs if t.name == name), None)
    if a is None or a.ndim == 0 or a.shape[-1] < 2 or spec.dtype(case) not in FLOAT_DTYPES:
        return None
    a = np.array(a, copy=True)
    a[..., -1] = 0
    return case, {name: a}


def stale_state(case, host: dict):
    out = {}
    for t in case.spec.outputs:
        if "state" not in t.name:
            continue
        for name in STATE_INPUTS:
            if name in host and tuple(host[name].shape) == tuple(t.shape_of(case)):
                out[t.name] = host[name]
                break
    return out or None


RUN_MISTAKES: dict[str, Callable] = {
    "eps_x10": eps_x10,
    "code_pm1": code_pm1,
    "drop_last_term": drop_last_term,
    "stale_state": stale_state,
}


# --- the reference impl and its planted copies ---------------------------------------------------

def reference_impl(op: str, backends=PREFERRED_BACKENDS):
    """The op's correct impl runnable here: the first registered builtin impl of the op, on the
    first of `backends` that has one available, that is not report-only, staged or a mutant.
    An op with no builtin impl (one a plugin registers) is audited through its plugin's impls
    alike; a builtin op never through a plugin's (e.g. the test mutants' emulations)."""
    import gpu_impls

    impls = [i for i in gpu_impls.impls().values() if i.op == op]
    builtin = [i for i in impls if gpu_impls.origin(i.id) == "builtin"]
    for name in backends:
        backend = gpu_impls.backend(name)
        if not backend.available()[0]:
            continue
        for impl in builtin or impls:
            if (impl.backend == name and not impl.report_only and impl.stages is None
                    and "mutant" not in impl.name and impl.available(backend)[0]):
                return impl
    return None


def _host_inputs(backend, inputs: dict, case) -> dict:
    return {t.name: backend.to_host(inputs[t.name], t.dtype(case)).reshape(t.shape_of(case))
            for t in case.spec.inputs if t.name in inputs}


def planted_inputs(impl, backend, mistake: str, fn, seen: dict):
    """`impl` run on what the input mistake `fn` (`eps_x10`, `code_pm1`, `drop_last_term`)
    edited: the case's params or some inputs. `seen` as `planted`'s."""
    def run(launch, inputs, outputs, case):
        host = _host_inputs(backend, inputs, case)
        edit = fn(case, host)
        if edit is None:
            seen["applied"] = seen["changed"] = False
            return impl.run(launch, inputs, outputs, case)
        run_case, edited = edit
        # an edit that changes no bit of what the impl reads (drop_last_term on a strictly
        # lower-triangular A, whose last column is zero) is the correct program: n/a
        seen["applied"] = seen["changed"] = run_case.params != case.params or any(
            np.ascontiguousarray(a).tobytes() != np.ascontiguousarray(host[k]).tobytes()
            for k, a in edited.items())
        given = {**inputs, **{k: backend.to_device(np.ascontiguousarray(a))
                              for k, a in edited.items()}}
        return impl.run(launch, given, outputs, run_case)
    return dataclasses.replace(impl, name=f"{impl.name}~{mistake}", run=run)


def planted(impl, backend, mistake: str, fn, seen: dict):
    """`impl` with `fn` applied to each of its outputs after it ran, as a new (unregistered)
    Impl whose run returns fresh device arrays (an input mistake: `planted_inputs`;
    `stale_state` replaces the state outputs by the state inputs). `seen` gets, per call,
    whether the mistake fit some output ("applied") and whether it changed any bit
    ("changed")."""
    if fn in (eps_x10, code_pm1, drop_last_term):
        return planted_inputs(impl, backend, mistake, fn, seen)

    def run(launch, inputs, outputs, case):
        if fn is stale_state:
            stale = stale_state(case, _host_inputs(backend, inputs, case)) or {}
            edit = lambda host, dtype, name: stale.get(name)  # noqa: E731
        else:
            edit = lambda host, dtype, name: fn(host, dtype)  # noqa: E731
        returned = impl.run(launch, inputs, outputs, case)
        backend.synchronize()
        new, seen["applied"], seen["changed"] = {}, False, False
        for t in case.spec.outputs:
            arr = returned.get(t.name) if returned is not None else None
            if arr is None:
                arr = outputs[t.name]
            dtype = t.dtype(case)
            host = backend.to_host(arr, dtype).reshape(t.shape_of(case))
            bad = edit(host, dtype, t.name)
            if bad is None:
                new[t.name] = arr
                continue
            bad = np.ascontiguousarray(bad, dtype=storage_dtype(dtype))
            seen["applied"] = True
            seen["changed"] |= bad.tobytes() != np.ascontiguousarray(host).tobytes()
            new[t.name] = backend.to_device(bad)
        return new
    return dataclasses.replace(impl, name=f"{impl.name}~{mistake}", run=run)


# --- the audit -----------------------------------------------------------------------------------

@dataclass
class Cell:
    """One op x dtype x mistake: of `n` counted cases, `failed` failed the check, `errors`
    raised, `unchanged` were left bit-identical by the mistake (and so passed)."""
    op: str
    impl: str
    dtype: str
    mistake: str
    n: int = 0
    failed: int = 0
    errors: int = 0
    unchanged: int = 0
    messages: list = field(default_factory=list)
    slipped: list = field(default_factory=list)  # cases passed though the mistake changed bits

    @property
    def passed(self) -> int:
        return self.n - self.failed - self.errors


@dataclass
class OpAudit:
    op: str
    impl: str
    cells: dict  # (dtype, mistake) -> Cell
    cases: dict  # dtype -> number of commit-tier valid cases
    baseline: dict  # dtype -> cases the unmutated impl does not pass (left out)


def audit_op(impl, dtypes=None, mistakes=None, tier: str = "commit") -> OpAudit:
    """The audit of one op through its reference `impl` (module docstring)."""
    import gpu_impls
    from cases.generate import Work, plan
    from runners.correctness import check

    mistakes = {**MISTAKES, **RUN_MISTAKES} if mistakes is None else mistakes
    backend = gpu_impls.backend(impl.backend)
    work = plan([impl], dtypes=dtypes, tier=tier, invalid=False)
    result = OpAudit(impl.op, impl.id, {}, {}, {})
    seen: dict = {}
    wrapped = {m: planted(impl, backend, m, fn, seen) for m, fn in mistakes.items()}
    for w in work:
        dt = w.case.dtype
        result.cases[dt] = result.cases.get(dt, 0) + 1
        result.baseline.setdefault(dt, 0)
        for m in mistakes:
            result.cells.setdefault((dt, m), Cell(impl.op, impl.id, dt, m))
        if check(w, backend)["status"] != "pass":
            result.baseline[dt] += 1
            continue
        for m, mutant in wrapped.items():
            seen.clear()
            row = check(Work(mutant, w.case, "valid"), backend)
            if "applied" in seen and not seen["applied"]:
                continue  # the mistake fits none of this case's outputs
            cell = result.cells[(dt, m)]
            cell.n += 1
            if row["status"] == "pass":
                if seen.get("changed", True):
                    cell.slipped.append(w.case)
                else:
                    cell.unchanged += 1
            elif row["status"] == "error":
                cell.errors += 1
                cell.messages.append(f"{w.case.id}: {row['message'][:200]}")
            else:
                cell.failed += 1
    return result


def uncaught(audits: list[OpAudit], admitted=None) -> list[tuple[str, str, int]]:
    """(op, mistake, cases) for each mistake that passed every counted case of an op (over all
    its dtypes) and that the op does not admit (`ADMITTED`)."""
    admitted = ADMITTED if admitted is None else admitted
    out = []
    for a in audits:
        for m in dict.fromkeys(m for _, m in a.cells):
            cells = [c for (_, mm), c in a.cells.items() if mm == m]
            n = sum(c.n for c in cells)
            if n and not any(c.failed or c.errors for c in cells) \
                    and m not in admitted.get(a.op, {}):
                out.append((a.op, m, n))
    return out


def errored(audits: list[OpAudit]) -> list[Cell]:
    return [c for a in audits for c in a.cells.values() if c.errors]


# --- cases that admit the all-zero output (issue 49 item 3) --------------------------------------

def admits_zeros(case, numerics=None) -> bool | None:
    """Whether `case`'s admissible set (the oracle's bounds for `numerics`, default: an impl
    that declares nothing, the widest set) holds the all-zero output; None where the exact
    answer rounded to each output's dtype (the reference) is all zero: zeros are then the
    right answer (e.g. silu(x) y of `tiny` x and y, whose products underflow f32)."""
    from cases.model import make_inputs
    from oracle.comparators import judge_outputs
    from oracle.numerics import DEFAULT
    from runners.oracle_cache import reference_and_bounds

    spec = case.spec
    inputs = make_inputs(case)
    exact, ref, bounds, _ = reference_and_bounds(case, inputs, numerics or DEFAULT, ftz=False)
    with np.errstate(invalid="ignore"):
        if all(not np.any(np.asarray(ref[t.name]).astype(np.float64) != 0)
               for t in spec.outputs):
            return None
    out = {t.name: np.zeros(t.shape_of(case), dtype=storage_dtype(t.dtype(case)))
           for t in spec.outputs}
    verdicts = judge_outputs(spec, case, inputs, out, exact, ref, bounds)
    return all(v.ok for v in verdicts.values())


def representatives(op: str) -> list:
    """One gate case per (label, dist, dtype) of the op: the cheapest (`case_cost`), every
    preset and generator label each distribution meets."""
    from cases.generate import gate_cases

    from cases.tiers import case_cost

    best: dict = {}
    for case in gate_cases(op):
        key = (case.label, case.dist, case.dtype)
        if key not in best or case_cost(case) < case_cost(best[key]):
            best[key] = case
    return list(best.values())


# {(op, dist): why}: the gate cases that admit the all-zero output by design (each a reason from
# the op's contract); `zero_admitting` finds exactly these (tests/test_zero_admitting.py).
ZERO_ADMITTED: dict[tuple[str, str], str] = {
    ("rms_norm", "f32_overflow"): (
        "mean(x^2) overflows f32 (|x| ~ 1e20): a kernel that sums in f32 gets inf, "
        "rsqrt(inf) = 0 and out = 0, its IEEE answer; one that scales first gets the exact "
        "answer. The contract admits both (oracle/norms.py \"Domain\"), so for an impl that "
        "declares neither these cases cannot tell a kernel that writes zeros from one that "
        "overflows; one declaring overflow=\"inf\" (cuda:kp_rms_norm) is held to 0 alone"),
}


def zero_admitting(ops) -> list:
    """(op, label, dist, dtype, case id) of every representative case (`representatives`)
    whose admissible set holds the all-zero output where the exact answer is not zero."""
    out = []
    for op in ops:
        for case in representatives(op):
            if admits_zeros(case):
                out.append((op, case.label, case.dist, case.dtype, case.id))
    return out
