"""`kparity ops` (ops, impls and where each came from, backends here; --matrix: what runs here
and why not) and `kparity cases` (the (impl, case) pairs a check would run)."""

from __future__ import annotations

from collections import Counter, defaultdict

from rich.markup import escape
from rich.table import Table

from cases.generate import gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.spec import registry as op_registry
from verbs.console import console
from verbs.selection import (add_filter_args, add_seed_arg, backend_named, registered_impls,
                             select_impls, tier_flag, work_list)
from verbs.usage import split_csv

ORDER = 0  # `kparity --help` lists the verb groups by ORDER: what is here comes first


def add_parsers(sub) -> None:
    ops = sub.add_parser("ops", help="ops, impls (and where each came from), backends here")
    ops.add_argument("--matrix", action="store_true",
                     help="support matrix, op x impl x dtype: runs here (how many of the op's "
                          "cases of that dtype the impl's contract admits), refused by "
                          "contract (and the invariant), or backend missing (and why)")
    ops.add_argument("--coverage", action="store_true",
                     help="per op, what each tier covers: impls, dtypes, distributions, "
                          "parameter values, dispatch edges, cases and contract invariants "
                          "(commit / nightly); exit 1 if an (impl, dtype, distribution) is "
                          "nightly-only")
    ops.add_argument("--family", metavar="NAME",
                     help="only the ops of family NAME (the `family` column)")
    ops.add_argument("--files", action="store_true",
                     help="with --family: where the family lives, read from the code: its "
                          "oracle, cases, each backend's impl modules, CUDA kernels and headers, "
                          "and the tests naming its ops")
    cases = sub.add_parser("cases", help="what would run: (impl, case) pairs, per impl")
    add_filter_args(cases)
    cases.add_argument("--invalid", action="store_true",
                       help="include the violating cases (one per contract invariant)")
    cases.add_argument("--list", action="store_true",
                       help="print each case: id, impl, op[dims] dtype distribution, its "
                            "params, label")
    cases.add_argument("--limit", type=int, default=200, metavar="N",
                       help="print at most N cases with --list (200)")
    add_seed_arg(cases)
    tier_flag(cases)


def cmd_ops(args) -> int:
    import gpu_impls

    impls = registered_impls()
    if args.matrix:
        return support_matrix(impls)
    if args.coverage:
        return coverage_table(impls)
    if args.files:
        return family_files_table(args.family, impls)
    families = {spec.family for spec in op_registry().values()}
    if args.family is not None and args.family not in families:
        console.print(f"[red]--family {args.family!r}: no op has it; families: "
                      f"{', '.join(sorted(families))}[/red]")
        return 2
    table = Table(title="ops and impls (impls from plugins: see below)")
    for col in ("op", "family", "dims", "impls"):
        table.add_column(col)
    for name, spec in sorted(op_registry().items()):
        if args.family is not None and spec.family != args.family:
            continue
        ids = sorted(i.id for i in impls.values() if i.op == name)
        table.add_row(name, spec.family, ", ".join(spec.dims), ", ".join(ids))
    console.print(table)
    by_origin = defaultdict(list)
    for impl_id in sorted(impls):
        by_origin[gpu_impls.origin(impl_id)].append(impl_id)
    builtin = by_origin.pop("builtin", [])
    if by_origin:
        plugins = Table(title="impls from plugins")
        plugins.add_column("from")
        plugins.add_column("impls")
        for where, ids in sorted(by_origin.items()):
            plugins.add_row(escape(where), ", ".join(ids))
        console.print(plugins)
    console.print(f"{len(builtin)} builtin impls (gpu_impls/<backend>/), "
                  f"{len(impls) - len(builtin)} from plugins (--plugin, or a `kparity.plugins` "
                  "entry point)")
    console.print(backends_table())
    return 0


def family_files_table(family: str | None, impls: dict) -> int:
    """`ops --family NAME --files` (`verbs/family_files.py`)."""
    from verbs.family_files import family_files

    if family is None:
        console.print("[red]--files lists one family's files: add --family NAME (`kparity ops` "
                      "shows each op's family)[/red]")
        return 2
    try:
        parts = family_files(family, impls)
    except ValueError as e:
        console.print(f"[red]{escape(str(e))}[/red]")
        return 2
    table = Table(title=f"family {family}: where it lives")
    table.add_column("part")
    table.add_column("files")
    order = ["ops", "oracle", "cases", *sorted(p for p in parts if p.startswith("impls")),
             "kernels", "tests"]
    for part in order:
        table.add_row(part, "\n".join(parts[part]) or "-")
    console.print(table)
    return 0


def backends_table() -> Table:
    import gpu_impls

    table = Table(title="backends here")
    table.add_column("backend")
    table.add_column("available")
    table.add_column("device / why not")
    for b in gpu_impls.BACKENDS:
        ok, why = backend_named(b).available()
        table.add_row(b, "yes" if ok else "no", escape(why))
    return table


def support_matrix(impls: dict) -> int:
    """`ops --matrix`, like llama.cpp's `test-backend-ops support`: per impl and dtype, whether
    it runs here (n of the op's gate cases of that dtype its contract admits), is refused by its
    contract for every such case (the invariant most of them break), or its backend is missing
    here (why). Contracts are pure Python: no framework is imported beyond the availability
    checks `ops` makes anyway."""
    from gpu_impls.contract import ContractError

    table = Table(title="support matrix: cases of each dtype the impl runs here, of the op's "
                        "gate cases")
    for col in ("op", "impl", *FLOAT_DTYPES, "sum order", "why not"):
        table.add_column(col, no_wrap=col in ("op", "impl", "sum order"))
    cases_of, sums = {}, {}
    for impl in sorted(impls.values(), key=lambda i: (i.op, i.id)):
        if impl.op not in cases_of:
            cases_of[impl.op] = gate_cases(impl.op)
            sums[impl.op] = _summing_case(cases_of[impl.op])
        backend = backend_named(impl.backend)
        ok, missing = impl.available(backend)
        if not backend.available()[0]:  # the backend's own why is in the table below, once
            missing = f"no {impl.backend} backend here (why: below)"
        cells, whys = [], defaultdict(list)
        for dtype in FLOAT_DTYPES:
            cases = [c for c in cases_of[impl.op] if c.dtype == dtype]
            refused = Counter()
            for case in cases:
                try:
                    impl.contract.check(impl.id, case)
                except ContractError as e:
                    refused[e.invariant] += 1
            admitted = len(cases) - sum(refused.values())
            if not cases:
                cells.append("[dim]no cases[/]")
            elif not admitted:
                cells.append("[yellow]refused[/]")
                whys[f"refused by contract: `{refused.most_common(1)[0][0]}`"].append(dtype)
            elif not ok:
                cells.append("[red]missing[/]")
                whys[missing].append(dtype)
            else:
                cells.append(f"[green]runs[/] {admitted}/{len(cases)}")
        why = "; ".join(w if len(whys) == 1 and len(ds) == len(FLOAT_DTYPES)
                        else f"{', '.join(ds)}: {w}" for w, ds in whys.items())
        table.add_row(impl.op, impl.id, *cells, _sum_order(impl, sums[impl.op]), escape(why))
    console.print(table)
    console.print("sum order: the order of the f32 sums the impl declares (`Impl.numerics`), "
                  "held to by the bounds; [yellow]undeclared[/]: every order is admitted (a "
                  "wider bound); -: the op's bound has no sum whose order an impl declares")
    console.print(backends_table())
    return 0


def _summing_case(cases):
    """The op's cheapest gate case if its bound reads a declared summation order, else None."""
    from cases.model import make_inputs
    from cases.tiers import case_cost

    normal = [c for c in cases if c.dist == "normal"] or cases
    if not normal:
        return None
    case = min(normal, key=case_cost)
    return case if case.spec.sum_sites(case, make_inputs(case)) else None


def _sum_order(impl, case) -> str:
    """"-" (no sum to declare), the declared order, "per case" (plans from the case's
    geometry), "partly" (some of the op's sums declared), or "undeclared"."""
    if case is None:
        return "-"
    if not impl.declares_order:
        return "[yellow]undeclared[/]"
    if callable(impl.numerics):  # a case the impl's contract admits: its launch's plan
        from gpu_impls.contract import ContractError

        try:
            impl.contract.check(impl.id, case)
        except ContractError:
            return "[green]per case[/]"
    from cases.model import make_inputs

    numerics = impl.numerics_for(case)
    sites = case.spec.sum_sites(case, make_inputs(case), numerics)
    open_sites = {site for site in sites if numerics.order(site).kind == "any"}
    if open_sites:
        named = sorted(site for site in sites - open_sites if site)
        return f"[green]partly[/] ({', '.join(named)})"
    if callable(impl.numerics):
        return "[green]per case[/]"  # e.g. kp_rms_norm: threads per row follow the shape
    return f"[green]{escape(str(numerics.reduction))}[/]"


def coverage_table(impls: dict) -> int:
    """`ops --coverage`: `cases.coverage.coverage` as a table, each cell commit / nightly, with a
    totals row; exit 1 where some (impl, dtype, distribution) only nightly covers."""
    from cases.coverage import coverage

    per_op = coverage(impls.values())
    table = Table(title="what each tier covers (commit / nightly) over every registered impl")
    cols = ("impls", "dtypes", "dists", "params", "edges", "cases")
    for col in ("op", *cols, "invariants", "nightly-only"):
        table.add_column(col, justify="left" if col == "op" else "right", no_wrap=True)
    totals = {t: {c: set() for c in cols[:-1]} | {"cases": 0} for t in ("commit", "nightly")}
    gaps = invariants = 0
    for op, row in sorted(per_op.items()):
        cells = []
        for col in cols:
            a, b = row["commit"][col], row["nightly"][col]
            cells.append(f"{a} / {b}" if col == "cases" else f"{len(a)} / {len(b)}")
            for tier in ("commit", "nightly"):
                if col == "cases":
                    totals[tier]["cases"] += row[tier]["cases"]
                else:
                    totals[tier][col] |= {(op, x) for x in row[tier][col]}
        gaps += len(row["nightly_only"])
        invariants += row["invariants"]
        table.add_row(op, *cells, str(row["invariants"]),
                      str(len(row["nightly_only"])) if row["nightly_only"] else "0")
    table.add_section()
    table.add_row("total", *(f"{totals['commit'][c]} / {totals['nightly'][c]}" if c == "cases"
                             else f"{len(totals['commit'][c])} / {len(totals['nightly'][c])}"
                             for c in cols), str(invariants), str(gaps))
    console.print(table)
    console.print("dists, params: distinct per op over its impls; edges: (impl, edge or "
                  "cheap shape, element width); every invariant's violating case runs in both tiers",
                  style="dim")
    if gaps:
        console.print(f"[red]{gaps} (impl, dtype, distribution) only in nightly[/]")
        return 1
    return 0


def cmd_cases(args) -> int:
    impls = select_impls(args, need_available=False)
    work = work_list(args, impls)
    if not args.invalid:
        work = [w for w in work if w.expect == "valid"]
    counts = Counter()
    shown = 0
    for w in work:
        counts[(w.impl.id, w.expect)] += 1
        if args.list and shown < args.limit:
            shown += 1
            extra = f"  breaks `{w.invariant}`" if w.expect == "rejected" else ""
            params = " ".join(f"{k}={v}" for k, v in w.case.param_items)  # the case's own
            console.print(escape(f"{w.case.id}  {w.impl.id:32s} {w.case.short()}"
                                 f"{'  ' + params if params else ''}  {w.case.label}{extra}"),
                          soft_wrap=True)
    tier = "" if getattr(args, "cases", None) else f" ({args.tier} tier)"
    table = Table(title=f"{len(work)} (impl, case) pairs would run{tier}")
    for col in ("impl", "valid cases", "violating cases"):
        table.add_column(col)
    for impl in impls:
        table.add_row(impl.id, str(counts[(impl.id, "valid")]), str(counts[(impl.id, "rejected")]))
    console.print(table)
    from verbs.timing import print_bench_presets  # the timing verbs' own section
    print_bench_presets(impls, split_csv(args.dtype) or None)
    return 0


VERBS = {"ops": cmd_ops, "cases": cmd_cases}
