"""`kparity ops` (ops, impls and where each came from, backends here; --matrix: what runs here
and why not) and `kparity cases` (the (impl, case) pairs a check would run)."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from cases.generate import gate_cases
from oracle.dtypes import FLOAT_DTYPES
from oracle.spec import registry as op_registry
from verbs.console import console
from verbs.outputs import output_path
from verbs.selection import (add_filter_args, add_seed_arg, backend_named, registered_impls,
                             select_impls, tier_flag, verbose_flag, work_list)
from verbs.usage import UsageError, split_csv, unknown

ORDER = 0  # `kparity --help` lists the verb groups by ORDER: what is here comes first
GROUP = "what is here"  # its heading in `kparity --help`


def add_parsers(sub) -> None:
    ops = sub.add_parser("ops", help="ops, impls (and where each came from), backends here; "
                                     "--matrix: what runs here, and why not")
    ops.add_argument("--matrix", action="store_true",
                     help="support matrix, impl x dtype by family and op: runs here (how many of "
                          "the op's cases of that dtype the impl's contract admits), refused by "
                          "contract (and the invariant), or missing here (and why); with "
                          "--family, that family's")
    ops.add_argument("--html", metavar="FILE", type=output_path,
                     help="write the support matrix's full grid (every reason in full) to FILE "
                          "as one HTML page; implies --matrix")
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
    cases = sub.add_parser("cases", help="what would run: (impl, case) pairs, per impl; "
                                         "--list prints each case")
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
    verbose_flag(cases)


def cmd_ops(args) -> int:
    import gpu_impls

    impls = registered_impls()
    families = {spec.family for spec in op_registry().values()}
    if args.family is not None and args.family not in families:
        raise unknown("family", args.family, families)
    if args.matrix or args.html:
        return support_matrix(impls, args.family, args.html)
    if args.coverage:
        return coverage_table(impls)
    if args.files:
        return family_files_table(args.family, impls)
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
        raise UsageError("--files lists one family's files\n  add --family NAME (`kparity ops` "
                         "shows each op's family)")
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


def support_matrix(impls: dict, family: str | None = None, html: Path | None = None) -> int:
    """`ops --matrix`, like llama.cpp's `test-backend-ops support`: per impl and dtype, whether
    it runs here (n of the op's gate cases of that dtype its contract admits), is refused by its
    contract for every such case (the invariant most of them break), or is missing here (why).
    On the terminal, compact and at most MATRIX_WIDTH columns wide: impls as rows under their
    family and op, the reasons shortened; `--html FILE` writes the full grid as one page.
    Contracts are pure Python: no framework is imported beyond the availability checks `ops`
    makes anyway."""
    rows = matrix_rows(impls, family)
    # rich fits the columns into the width given, whatever the longest impl id (a plugin's)
    console.print(matrix_table(rows), width=min(console.width, MATRIX_WIDTH))
    for line in MATRIX_LEGEND:
        console.print(line, soft_wrap=True)
    console.print(backends_table())
    if html:
        html.write_text(matrix_html(rows))
        console.print(escape(f"support matrix, every reason in full: {html}"), soft_wrap=True)
    return 0


MATRIX_WIDTH = 120  # the terminal matrix's widest line
MATRIX_LEGEND = (  # under the terminal matrix, each line within MATRIX_WIDTH
    "f32 f16 bf16: the op's cases of that dtype the impl runs here ([green]n[/], or [green]n/m[/] "
    "where its contract admits n of m);",
    "  [yellow]ref[/]: its contract refuses every one; [red]no[/]: not runnable here; -: the op "
    "has no case of that dtype",
    "sum order: the order of the f32 sums the impl declares (`Impl.numerics`), held to by the "
    "bounds;",
    "  [green]one answer[/]: every f32 operation declared, the check wants its one result "
    "(oracle/emulated.py);",
    "  [yellow]undeclared[/]: every order admitted (a wider bound); -: no sum to declare. "
    "--html FILE: every reason in full")
CELL = {"runs": "green", "ref": "yellow", "no": "red", "-": "dim"}  # a dtype cell's colour


def matrix_rows(impls: dict, family: str | None = None) -> list[dict]:
    """The support matrix's rows, one per impl (of `family`), by family, op and impl id: family,
    op, impl, `cells` {dtype: (state, admitted, of)} with state runs / ref (refused by its
    contract) / no (not runnable here) / - (no case of the dtype), `sum_order` (rich markup),
    `why` (each reason in full) and `short` (the reasons in a few words)."""
    from gpu_impls.contract import ContractError
    from verbs.selection import short_reason

    specs = op_registry()
    chosen = [i for i in impls.values() if family is None or specs[i.op].family == family]
    cases_of, sums, rows = {}, {}, []
    for impl in sorted(chosen, key=lambda i: (specs[i.op].family, i.op, i.id)):
        if impl.op not in cases_of:
            cases_of[impl.op] = gate_cases(impl.op)
            sums[impl.op] = _summing_case(cases_of[impl.op])
        backend = backend_named(impl.backend)
        backend_ok = backend.available()[0]
        ok, missing = impl.available(backend)
        cells, whys, shorts = {}, defaultdict(list), defaultdict(list)
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
                cells[dtype] = ("-", 0, 0)
            elif not admitted:
                cells[dtype] = ("ref", 0, len(cases))
                invariant = refused.most_common(1)[0][0]
                whys[f"refused by contract: `{invariant}`"].append(dtype)
                shorts[f"`{invariant}`"].append(dtype)
            elif not ok:
                cells[dtype] = ("no", admitted, len(cases))
                whys[missing].append(dtype)
                shorts[short_reason(missing, backend_ok)].append(dtype)
            else:
                cells[dtype] = ("runs", admitted, len(cases))
        rows.append({"family": specs[impl.op].family, "op": impl.op, "impl": impl.id,
                     "cells": cells, "sum_order": _sum_order(impl, sums[impl.op]),
                     "why": _by_dtype(whys, ", ", ": "), "short": _by_dtype(shorts, " ", " ")})
    return rows


def _by_dtype(reasons: dict[str, list[str]], comma: str, colon: str) -> str:
    """Reasons joined, each after the dtypes it holds for unless it holds for every dtype."""
    if len(reasons) == 1 and len(next(iter(reasons.values()))) == len(FLOAT_DTYPES):
        return next(iter(reasons))
    return "; ".join(f"{comma.join(dtypes)}{colon}{why}" for why, dtypes in reasons.items())


def _cell(state: str, admitted: int, of: int) -> str:
    """A dtype's cell on the terminal: n (or n/m where the contract admits n of m), ref, no, -."""
    text = state if state != "runs" else (str(of) if admitted == of else f"{admitted}/{of}")
    return f"[{CELL[state]}]{text}[/]"


def matrix_table(rows: list[dict]) -> Table:
    """The terminal matrix: a heading row per family and op, impls under it, one line each (an
    overlong sum order or reason is cut short: the HTML page has it in full)."""
    from rich import box

    table = Table(title="support matrix: the gate cases of each dtype each impl runs here",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    longest = max((len(row["impl"]) for row in rows), default=0)  # a plugin's may be long
    widths = {"impl": min(max(longest + 2, 20), 48), **{d: 7 for d in FLOAT_DTYPES},
              "sum order": 14}
    narrowest = {"impl": 20, **{d: 6 for d in FLOAT_DTYPES}, "sum order": 10}  # a narrow terminal
    for col, width in widths.items():
        table.add_column(col, no_wrap=True, min_width=narrowest[col], max_width=width,
                         overflow="ellipsis",
                         justify="left" if col in ("impl", "sum order") else "right")
    # each column: its width, 2 of padding, 1 of separator (the first: no edge padding)
    why = MATRIX_WIDTH - sum(widths.values()) - 3 * (len(widths) + 1) + 1
    table.add_column("why not", no_wrap=True, max_width=why, overflow="ellipsis")
    op = family = None
    for row in rows:
        if row["family"] != family:
            if family is not None:
                table.add_section()
            family = row["family"]
            table.add_row(f"[bold magenta]{escape(family)}[/]")
        if row["op"] != op:
            op = row["op"]
            table.add_row(f" [bold]{escape(op)}[/]")
        table.add_row(f"  {escape(row['impl'])}", *(_cell(*row["cells"][d]) for d in FLOAT_DTYPES),
                      row["sum_order"], escape(row["short"]))
    return table


def matrix_html(rows: list[dict]) -> str:
    """The full grid as one HTML page: every row's family, op, impl, its dtype cells in words
    (runs n/m, refused, missing, no cases), sum order and every reason in full."""
    from rich.text import Text

    from results.report_html import esc, standalone_page, table

    words = {"runs": "runs", "ref": "refused", "no": "missing", "-": "no cases"}
    css = {"runs": "ok", "ref": "mixed", "no": "bad", "-": "none"}
    body = []
    for row in rows:
        cells = []
        for dtype in FLOAT_DTYPES:
            state, admitted, of = row["cells"][dtype]
            text = f"runs {admitted}/{of}" if state == "runs" else words[state]
            cells.append((esc(text), css[state]))
        body.append([esc(row["family"]), esc(row["op"]), esc(row["impl"]), *cells,
                     esc(Text.from_markup(row["sum_order"]).plain), esc(row["why"])])
    headers = ["family", "op", "impl", *FLOAT_DTYPES, "sum order", "why not"]
    return standalone_page("kparity support matrix: the gate cases of each dtype each impl runs "
                           "here", table(headers, body, raw=True))


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
    geometry), "one answer" (every f32 operation declared), "partly" (some of the op's sums
    declared), or "undeclared"."""
    if case is None:
        return "-"
    if not impl.declares_order:
        return "[yellow]undeclared[/]"
    if callable(impl.numerics):  # a case the impl's contract admits: its launch's plan
        from gpu_impls.contract import ContractError

        try:
            impl.contract.check(impl.id, case)
        except ContractError:  # the op's cheapest case is not one of its: its own cheapest
            from cases.generate import valid_cases
            from cases.tiers import case_cost

            own = [c for c in valid_cases(impl) if c.dist == "normal"]
            if not own:
                return "[green]per case[/]"
            case = min(own, key=case_cost)
    from cases.model import make_inputs

    numerics = impl.numerics_for(case)
    sites = case.spec.sum_sites(case, make_inputs(case), numerics)
    open_sites = {site for site in sites if numerics.order(site).kind == "any"}
    if open_sites:
        named = sorted(site for site in sites - open_sites if site)
        return f"[green]partly[/] ({', '.join(named)})"
    if numerics.one_answer:  # every f32 operation declared: held to one answer
        return "[green]one answer[/]"
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
