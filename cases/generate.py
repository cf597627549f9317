"""From gate cases and contracts to the work list: (impl, case, expected) triples.

For every impl: the gate cases of its op that its contract admits (expected "valid"), and one
violating case per invariant of its contract (expected "rejected"), built by applying the
invariant's `violation` dims to a valid case of that impl.

`seed` (`kparity check --seed N`) draws fresh data for every generated case: N is added to the
seed its source gave it (0 for every built-in source, so it becomes N). Added, not set: a source
whose cases differ only in seed keeps them distinct. Seed 0 leaves every case, and its id, as it
is; a new seed is a new id, so the store never mixes a case's results over different data.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from cases.model import Case
from cases.registry import bench_sources, sources
from cases.tiers import check_tier, commit_subset


@dataclass(frozen=True)
class Work:
    impl: object  # gpu_impls.Impl
    case: Case
    expect: str  # "valid" | "rejected"
    invariant: str = ""  # for expect == "rejected": the invariant the case breaks
    # Set where `case` is a bench case under another rounding convention (`admitted_variant`):
    # that bench case, whose inputs the variant is timed on
    base: Case | None = None


def gate_cases(op: str, seed: int = 0) -> list[Case]:
    """The op's gate cases, deduplicated by id, each re-seeded by `seed` (module docstring)."""
    if seed < 0:
        raise ValueError(f"seed {seed}: must be >= 0 (as a case file's)")
    src = sources()
    if op not in src:
        return []
    seen, out = set(), []
    for case in src[op]():
        if seed:
            case = case.with_seed(case.seed + seed)
        if case.id not in seen:
            seen.add(case.id)
            out.append(case)
    return out


def bench_cases(op: str) -> list[Case]:
    src = bench_sources()
    return src[op]() if op in src else []


def admitted_variant(impl, case: Case) -> Case | None:
    """`case` if the impl's contract admits it; else the same case under another rounding
    convention (the op's `conventions` params, every combination of their values in declared
    order) that it admits, or None. A convention is a correctness contract, not a cost: the
    variant has the case's shapes and dtypes (its own id: the params differ), and `bench` and
    `ab` time it on the case's inputs (`Work.base`)."""
    if impl.contract.admits(case):
        return case
    names = case.spec.conventions
    for values in product(*(case.spec.param_values[n] for n in names)):
        variant = case.replace(**dict(zip(names, values)))
        if variant.id != case.id and impl.contract.admits(variant):
            return variant
    return None


def convention(case: Case) -> str:
    """The case's rounding convention, e.g. "rounding=normed"; "" for an op without one."""
    return ",".join(f"{n}={case.params[n]}" for n in case.spec.conventions)


def selected(case, dtypes=None, presets=None) -> bool:
    """Whether `case` passes the --dtype and --preset filters (None: no filter; a preset
    matches a case whose label contains it)."""
    return ((not dtypes or case.dtype in dtypes)
            and (not presets or any(p in case.label for p in presets)))


def bench_plan(impls, dtypes=None, presets=None) -> list[Work]:
    """(impl, bench case) pairs, each case under a convention the impl's contract admits
    (`admitted_variant`), filtered like `plan`."""
    out = []
    for impl in impls:
        for c in bench_cases(impl.op):
            if not selected(c, dtypes, presets):
                continue
            variant = admitted_variant(impl, c)
            if variant is not None:
                out.append(Work(impl, variant, "valid", base=None if variant is c else c))
    return out


def bench_presets(impls, dtypes=None) -> dict[str, list[Work]]:
    """The bench presets (`bench:<preset>` labels) of `impls`' ops, each with the (impl, case)
    pairs of `bench_plan` it selects, in label order (`kparity cases` lists them)."""
    out: dict[str, list[Work]] = {}
    for w in bench_plan(impls, dtypes=dtypes):
        out.setdefault(w.case.label.split(":", 1)[-1], []).append(w)
    return dict(sorted(out.items()))


def valid_cases(impl, seed: int = 0) -> list[Case]:
    return [c for c in gate_cases(impl.op, seed) if impl.contract.admits(c)]


def violating_cases(impl, seed: int = 0) -> list[Work]:
    """One case per invariant, breaking that invariant (checked, so a bad example fails loudly);
    built from a valid case, so it carries that case's seed."""
    valid = valid_cases(impl, seed)
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


def sampled(work: list[Work], most: int) -> list[Work]:
    """At most `most` valid normal-distribution cases of one impl's work, spread evenly over its
    dtypes (the lowest case ids of each: the same sample every run), plus every violating case:
    what the GPU gate and an unnamed sweep run of an impl with `gate_cases_max`."""
    valid = [w for w in work if w.expect == "valid" and w.case.dist == "normal"]
    by_dtype: dict[str, list[Work]] = {}
    for w in sorted(valid, key=lambda w: w.case.id):
        by_dtype.setdefault(w.case.dtype, []).append(w)
    keep = [w for ws in by_dtype.values() for w in ws[:most // len(by_dtype)]]
    return keep + [w for w in work if w.expect == "rejected"]


def plan(impls, dtypes=None, presets=None, invalid: bool = True, valid: bool = True,
         seed: int = 0, tier: str = "nightly") -> list[Work]:
    """Work for `impls`, filtered by dtype and preset label (substring of the case label), its
    cases re-seeded by `seed` (module docstring). `tier` "commit" keeps, of each impl's valid
    cases that pass the filters, the smallest that cover what all of them show
    (`cases/tiers.py`: `--preset qwen3-8b` in the commit tier is that preset's cover, not
    nothing); "nightly" keeps every one (the default here: a caller that names no tier loses no
    case)."""
    check_tier(tier)
    out = []
    for impl in impls:
        gated = valid and not impl.report_only  # a speed baseline's results are not the op's
        mine = [c for c in valid_cases(impl, seed) if selected(c, dtypes, presets)] if gated else []
        if tier == "commit":
            mine = commit_subset(mine)
        out += [Work(impl, c, "valid") for c in mine]
        if invalid:
            out += [w for w in violating_cases(impl, seed) if selected(w.case, dtypes, presets)]
    return out
