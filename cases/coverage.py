"""What each tier covers (`kparity ops --coverage`): the commit tier's cases (`cases.tiers`) of
every impl's valid cases (`cases.generate`), per op."""

from __future__ import annotations

from cases.generate import valid_cases
from cases.tiers import TIERS, commit_subset, tier_features


def coverage(impls, seed: int = 0) -> dict[str, dict]:
    """Per op, what each tier covers over `impls` (report-only baselines left out, as in the
    plan): impls, dtypes, distributions, parameter values, dispatch edges, valid cases, contract
    invariants (one violating case each, the same in both tiers), and the (impl, dtype,
    distribution) triples only nightly has (none, by construction: a test checks it). `kparity
    ops --coverage` prints it."""
    out: dict[str, dict] = {}
    for impl in sorted(impls, key=lambda i: (i.op, i.id)):
        if impl.report_only:
            continue
        nightly = valid_cases(impl, seed)
        commit = commit_subset(nightly)
        row = out.setdefault(impl.op, {t: {"impls": set(), "dtypes": set(), "dists": set(),
                                          "params": set(), "edges": set(), "cases": 0}
                                      for t in TIERS} | {"invariants": 0, "nightly_only": set()})
        for tier, cases in (("commit", commit), ("nightly", nightly)):
            cell = row[tier]
            if cases:
                cell["impls"].add(impl.id)
            cell["cases"] += len(cases)
            for c in cases:
                cell["dtypes"].add(c.dtype)
                cell["dists"].add(c.dist)
            for f in tier_features(cases):
                if f[0] == "param":
                    cell["params"].add(f[2:])
                elif f[0] in ("edge", "shape"):
                    cell["edges"].add((impl.id,) + f[1:])
        row["invariants"] += len(impl.contract.invariants) if nightly else 0
        row["nightly_only"] |= ({(impl.id, c.dtype, c.dist) for c in nightly}
                                - {(impl.id, c.dtype, c.dist) for c in commit})
    return out
