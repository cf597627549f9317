"""From gate cases and contracts to the work list: (impl, case, expected) triples.

For every impl: the gate cases of its op that its contract admits (expected "valid"), and one
violating case per invariant of its contract (expected "rejected"), built by applying the
invariant's `violation` dims to a valid case of that impl.
"""

from __future__ import annotations

from dataclasses import dataclass

from cases.model import Case
from cases.registry import bench_sources, sources


@dataclass(frozen=True)
class Work:
    impl: object  # gpu_impls.Impl
    case: Case
    expect: str  # "valid" | "rejected"
    invariant: str = ""  # for expect == "rejected": the invariant the case breaks


def gate_cases(op: str) -> list[Case]:
    src = sources()
    if op not in src:
        return []
    seen, out = set(), []
    for case in src[op]():
        if case.id not in seen:
            seen.add(case.id)
            out.append(case)
    return out


def bench_cases(op: str) -> list[Case]:
    src = bench_sources()
    return src[op]() if op in src else []


def bench_plan(impls, dtypes=None, presets=None) -> list[Work]:
    """(impl, bench case) pairs the impl's contract admits, filtered like `plan`."""
    return [Work(impl, c, "valid") for impl in impls for c in bench_cases(impl.op)
            if impl.contract.admits(c) and (not dtypes or c.dtype in dtypes)
            and (not presets or any(p in c.label for p in presets))]


def valid_cases(impl) -> list[Case]:
    return [c for c in gate_cases(impl.op) if impl.contract.admits(c)]


def violating_cases(impl) -> list[Work]:
    """One case per invariant, breaking that invariant (checked, so a bad example fails loudly)."""
    valid = valid_cases(impl)
    if not impl.contract.invariants or not valid:
        return []
    base = next((c for c in valid if c.dtype == "f32" and c.dist == "normal"), valid[0])
    work = []
    for inv in impl.contract.invariants:
        case = base.replace(label=f"violates:{inv.name}", **inv.violation)
        if inv not in impl.contract.broken(case):
            raise AssertionError(f"{impl.id}: violation example {dict(inv.violation)} does not "
                                 f"break `{inv.name}`")
        work.append(Work(impl, case, "rejected", inv.name))
    return work


def plan(impls, dtypes=None, presets=None, invalid: bool = True, valid: bool = True) -> list[Work]:
    """Work for `impls`, filtered by dtype and preset label (substring of the case label)."""
    out = []
    for impl in impls:
        gated = valid and not impl.report_only  # a speed baseline's results are not the op's
        items = [Work(impl, c, "valid") for c in valid_cases(impl)] if gated else []
        if invalid:
            items += violating_cases(impl)
        for w in items:
            if dtypes and w.case.dtype not in dtypes:
                continue
            if presets and not any(p in w.case.label for p in presets):
                continue
            out.append(w)
    return out
