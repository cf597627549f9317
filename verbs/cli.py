"""kparity: differential correctness and benchmarking of LLM-inference GPU kernels against
NumPy oracles. Every check and timing is a row in a Parquet store.

Verbs (`kparity VERB --help` for each):
  what is here   ops       ops, impls (and where each came from), backends here;
                           --matrix: op x impl x dtype, what runs here and why not
                 cases     the (impl, case) pairs a check would run; --list prints each case
  correctness    check     sweep every selected impl over its op's cases against the oracle
                 repro     rerun one case by id (from the store or the generators)
  timing         bench     timing sweep over the bench cases
                 ab        A/B of impls: correctness, interleaved runs, a verdict
  history        compare   run vs run, or vs the last N runs: regressions
                 accept    accept a speed or error-budget change as the new baseline
                 sql       a DuckDB query over the store
                 report    static HTML dashboard of the store
                 nightly   check + bench + compare + report

Global options (--store, --plugin) go before or after the verb: `kparity --store DIR check`
and `kparity check --store DIR` are the same. Plugins register more ops and impls (a kernel
repo's own): `--plugin MODULE` (a dotted module importable from here, or a .py file; one that
fails to load is exit 2), and every `kparity.plugins` entry point installed (one that fails is
a warning; the rest runs). The store is .kparity/ here unless --store or $KPARITY_STORE.

Exit codes: 0 success, 1 a check failed (or a regression), 2 bad input (an unknown name lists
the valid ones, closest first), 3 nothing could run (no backend here for what was asked),
130 interrupted (Ctrl-C: the rows so far are kept; `check --resume last` runs the rest).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections import Counter, defaultdict

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cases.casefile import CaseFileError, closest
from cases.generate import Work, bench_cases, gate_cases, plan, valid_cases, violating_cases
from cases.model import Case
from gpu_impls import known_issues
from oracle.comparators import SUMMARIES, describe
from oracle.dtypes import FLOAT_DTYPES
from oracle.metrics import budget_text
from oracle.spec import registry as op_registry
from results.runinfo import new_run_id, run_row
from results.store import RowWriter, Store, StoreError
from runners import oracle_cache
from runners.correctness import judged_row, quarantined_row, repeated_row
from runners.verdicts import failure_kind, is_failure, outcome
from runners.isolation import MODES as ISOLATION_MODES, DeviceUnusable, runner_for
from verbs.outputs import add_flags as add_output_flags, write_check

# Wide enough for impl ids when output is not a terminal (CI logs, pipes).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 150)


class UsageError(Exception):
    """Bad input: printed as one message, exit code 2."""


def unknown(kind: str, given: str, valid) -> UsageError:
    return UsageError(f"unknown {kind} {given!r}. Valid {kind}s (closest first): "
                      + closest(given, valid))


def _split(values) -> list[str]:
    return [v for item in values or [] for v in item.split(",") if v]


# --- selection ---------------------------------------------------------------------------------

def _impls():
    import gpu_impls

    return gpu_impls.impls()


def _backend(name):
    import gpu_impls

    return gpu_impls.backend(name)


def select_impls(args, need_available: bool) -> list:
    """Impls matching --op/--impl/--backend; with need_available, only those runnable here."""
    import gpu_impls

    all_impls = _impls()
    ops = _split(args.op)
    for op in ops:
        if op not in op_registry():
            raise unknown("op", op, op_registry())
    backends = _split(args.backend)
    for b in backends:
        if b not in gpu_impls.BACKENDS:
            raise unknown("backend", b, gpu_impls.BACKENDS)
    wanted = _split(args.impl)
    by_name = defaultdict(list)
    for impl in all_impls.values():
        by_name[impl.name].append(impl.id)
    ids = set()
    for w in wanted:
        if w in all_impls:
            ids.add(w)
        elif w in by_name:
            ids.update(by_name[w])
        else:
            raise unknown("impl", w, list(all_impls) + list(by_name))
    for d in _split(args.dtype):
        if d not in FLOAT_DTYPES:
            raise unknown("dtype", d, FLOAT_DTYPES)

    chosen = [i for i in all_impls.values()
              if (not ops or i.op in ops) and (not backends or i.backend in backends)
              and (not ids or i.id in ids)]
    if not need_available:
        return sorted(chosen, key=lambda i: i.id)
    runnable, missing = [], {}
    for impl in chosen:
        backend_ok = _backend(impl.backend).available()[0]
        ok, why = impl.available(_backend(impl.backend))
        if ok:
            runnable.append(impl)
        else:
            missing.setdefault(impl.backend if not backend_ok else impl.id, why)
    for what, why in sorted(missing.items()):
        kind = "backend" if what in gpu_impls.BACKENDS else "impl"
        console.print(f"[yellow]skipping {kind} {what}[/]: {escape(why)}")
    if chosen and not runnable:
        console.print("[red]nothing to run: no backend for the selected impls is available here[/]")
        raise SystemExit(3)
    return sorted(runnable, key=lambda i: i.id)


def check_presets(args, source=gate_cases, extra=("edge", "violates")) -> list[str]:
    """The --preset values, each checked against the labels of the cases `source(op)` makes."""
    presets = _split(args.preset)
    if presets:
        labels = {c.label.split(":", 1)[-1] for op in op_registry() for c in source(op)}
        labels |= set(extra)
        for p in presets:
            if not any(p in label for label in labels):
                if source is gate_cases and any(p in c.label for op in op_registry()
                                                for c in bench_cases(op)):
                    raise UsageError(f"{p!r} is a bench preset: kparity bench --preset {p} "
                                     "times it. Valid presets here (closest first): "
                                     + closest(p, labels))
                raise unknown("preset", p, labels)
    return presets


def work_for(impl, case: Case) -> Work:
    """One (impl, case): expected to run, or to be refused by the impl's contract (a dtype it is
    not built for included: a user's bf16 case on an f32-only kernel is its refusal, not its
    failure)."""
    from gpu_impls.contract import ContractError

    try:
        impl.contract.check(impl.id, case)
    except ContractError as e:
        return Work(impl, case, "rejected", e.invariant)
    return Work(impl, case, "valid")


def work_list(args, impls) -> list[Work]:
    seed = getattr(args, "seed", 0) or 0
    if seed < 0:
        raise UsageError(f"--seed {seed}: at least 0")
    if getattr(args, "cases", None):  # a case file: each case against every selected impl of its op
        if seed:  # a file's cases keep their own seeds: ignoring --seed would be silent
            raise UsageError(f"--seed {seed} re-seeds generated cases; a --cases file's cases "
                             "keep the seeds the file gives them")
        return case_file_work(args.cases, impls, _split(args.dtype))
    return plan(impls, dtypes=_split(args.dtype) or None, presets=check_presets(args) or None,
                invalid=not getattr(args, "valid_only", False), seed=seed)


def case_file_work(path: str, impls, dtypes: list[str]) -> list[Work]:
    """Each case of the file against every selected impl of its op: run where the impl's
    contract admits it, recorded as refused where it does not. A report-only impl (a speed
    baseline computing another function) never gates, as in the generated plan. A user's case
    that no selected impl would check is an error, before anything runs: a sweep that launched
    nothing must not read as a pass."""
    from cases.casefile import load_cases

    work, unrun = [], []
    for index, case in enumerate(load_cases(path)):
        if dtypes and case.dtype not in dtypes:
            continue
        mine = [impl for impl in impls if impl.op == case.op]
        items = [w for w in (work_for(impl, case) for impl in mine)
                 if not (w.impl.report_only and w.expect == "valid")]
        work += items
        why = {impl.id: refusal(impl, case) for impl in mine}
        if mine and all(why.values()):
            label = "" if case.label.startswith("file:") else f"{case.label!r}, "
            unrun.append(f"case {index} ({label}{case.short()}) runs on no selected impl:\n"
                         + "\n".join(f"  {text}" for text in why.values()))
    if unrun:
        raise UsageError(f"{path}: " + "\n".join(unrun) + "\nChange or drop the case, or "
                         "select an impl that runs it (--impl; `kparity ops` lists them)")
    return work


def refusal(impl, case: Case) -> str:
    """Why `impl` would not check `case` (its contract's refusal, naming the invariant and the
    nearest valid choice; or report-only), or "" where it would."""
    from gpu_impls.contract import ContractError

    if impl.report_only:
        return f"{impl.id}: report-only, never gated ({impl.report_only.split(': ')[0]})"
    try:
        impl.contract.check(impl.id, case)
    except ContractError as e:
        return str(e)
    return ""


def global_flags(args) -> str:
    """The global options a printed command needs to run again as this one did: the store
    (where it is not the default) and every plugin."""
    store = f" --store {args.store}" if getattr(args, "store", None) else ""
    return store + "".join(f" --plugin {p}" for p in getattr(args, "plugin", None) or [])


def repro_line(args, case_id: str, impl_id: str) -> str:
    return f"kparity{global_flags(args)} repro {case_id} --impl {impl_id}"


# --- verbs -------------------------------------------------------------------------------------

def cmd_ops(args) -> int:
    import gpu_impls

    impls = _impls()
    if args.matrix:
        return support_matrix(impls)
    table = Table(title="ops and impls (impls from plugins: see below)")
    for col in ("op", "family", "dims", "impls"):
        table.add_column(col)
    for name, spec in sorted(op_registry().items()):
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


def backends_table() -> Table:
    import gpu_impls

    table = Table(title="backends here")
    table.add_column("backend")
    table.add_column("available")
    table.add_column("device / why not")
    for b in gpu_impls.BACKENDS:
        ok, why = _backend(b).available()
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
    for col in ("op", "impl", *FLOAT_DTYPES, "why not"):
        table.add_column(col, no_wrap=col in ("op", "impl"))
    cases_of = {}
    for impl in sorted(impls.values(), key=lambda i: (i.op, i.id)):
        if impl.op not in cases_of:
            cases_of[impl.op] = gate_cases(impl.op)
        backend = _backend(impl.backend)
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
        table.add_row(impl.op, impl.id, *cells, escape(why))
    console.print(table)
    console.print(backends_table())
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
    table = Table(title=f"{len(work)} (impl, case) pairs would run")
    for col in ("impl", "valid cases", "violating cases"):
        table.add_column(col)
    for impl in impls:
        table.add_row(impl.id, str(counts[(impl.id, "valid")]), str(counts[(impl.id, "rejected")]))
    console.print(table)
    from verbs.timing import print_bench_presets  # the timing verbs' own section
    print_bench_presets(impls, _split(args.dtype) or None)
    return 0


# runs.filters: what --resume reruns the plan with (seed included: it decides every case id)
FILTERS = ("op", "impl", "backend", "dtype", "preset", "valid_only", "cases", "repeat", "seed")


def run_work(args, work: list[Work], verb: str, resume: str | None = None,
             kept: list[dict] | None = None, use_ledger: bool = True) -> list[dict]:
    """Run the work list, writing rows to the store as it goes; returns the rows (with `kept`,
    the rows a resumed run already had). `use_ledger=False`: known issues are not applied."""
    ledger = known_issues.ledger() if use_ledger else []  # a malformed entry stops here
    for entry in known_issues.unmatched(ledger, _impls()):
        console.print(escape(f"ledger: {entry.source} names impl {entry.impl!r}, which matches "
                             "no impl here (stale entry, or a typo)"), style="yellow")
    store = Store(args.store)
    store.ensure_writable()
    run_id = resume or new_run_id()
    if not resume:
        backends = sorted({w.impl.backend for w in work})
        devices = {b: _backend(b).device() for b in backends}
        versions = {k: v for b in backends for k, v in _backend(b).versions().items()}
        filters = {k: getattr(args, k, None) for k in FILTERS}
        store.write("runs", [run_row(run_id, verb, devices, versions, filters)], run_id, 0)

    rows = list(kept or [])
    maxfail = getattr(args, "maxfail", None)
    first_part = store.next_part("correctness", run_id)
    failed = done = 0
    cached = Counter()  # the oracle cache's outcome per row (runners/oracle_cache.py)
    try:
        with RowWriter(store, "correctness", run_id, first_part=first_part) as writer, \
                oracle_prefetch(args, work) as ahead, \
                runner_for(args, work) as run_case, Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(),
                console=console, transient=True) as progress:
            task = progress.add_task(verb, total=len(work), failed=0)
            repeat = getattr(args, "repeat", None) or 1
            for w in work:
                if maxfail is not None and failed >= maxfail:
                    break
                progress.update(task, description=f"{w.impl.id} {w.case.dtype}")
                computed_ahead = ahead.wait(w)  # its oracle entries, if the pool has them
                row = run_one(w, run_id, run_case, repeat, ledger)
                outcome_of_cache = row.pop(oracle_cache.CACHE_KEY, None)
                if outcome_of_cache is not None:
                    cached[computed_ahead or outcome_of_cache] += 1
                writer.add(row)
                rows.append(row)
                done += 1
                if is_failure(row):
                    failed += 1
                    if failed <= args.show_failures:
                        progress.console.print(
                            f"[red]{row['status'].upper()}[/] {w.impl.id} case {w.case.id} "
                            + escape(f"({w.case.short()}, {w.case.label}): "
                                     f"{row['message'][:300]}") + "\n"
                            + escape("    repro: " + repro_line(args, w.case.id, w.impl.id)),
                            soft_wrap=True)  # a repro line must survive copy-paste: never wrap
                progress.update(task, advance=1, failed=failed)
    except KeyboardInterrupt:  # the writer has closed: every finished row is in a part
        raise Interrupted(args, verb, run_id, store) from None
    summarize(rows, run_id, store, getattr(args, "seed", 0))
    if cached:
        console.print(escape(oracle_cache.summary(cached, ahead)), soft_wrap=True)
    if done < len(work):  # --maxfail: the verdict above is of the rows that ran
        console.print(f"[yellow]stopped early[/]: {failed} failing "
                      f"{'row' if failed == 1 else 'rows'} reached --maxfail {maxfail}; "
                      f"{len(work) - done} of {len(work)} (impl, case) pairs not run. "
                      + escape(f"The rest: {resume_command(args, run_id)}"), soft_wrap=True)
    return rows


def oracle_prefetch(args, work: list[Work]) -> oracle_cache.Prefetch:
    """The oracle entries the sweep lacks, computed ahead in a pool of processes while it runs
    (`runners/oracle_cache.py`); a bad KPARITY_CACHE_* setting is bad input."""
    from oracle.diskcache import CacheConfigError

    try:
        return oracle_cache.Prefetch(work, _backend, getattr(args, "plugin", None) or [])
    except CacheConfigError as e:
        raise UsageError(str(e)) from None


class Interrupted(Exception):
    """Ctrl-C during a sweep, after its finished rows were written: what was kept, and how to
    run the rest (`check --resume`)."""

    def __init__(self, args, verb: str, run_id: str, store: Store):
        import pyarrow.compute as pc

        kept = store.read("correctness", filter=pc.field("run_id") == run_id).num_rows
        rest = f"; the rest: {resume_command(args, run_id)}" if verb == "check" else ""
        super().__init__(f"{kept} rows of run {run_id} kept in {store.root}/{rest}")


def resume_command(args, run_id: str) -> str:
    """The command that runs what check run `run_id` left (its store and plugins named again)."""
    return f"kparity{global_flags(args)} check --resume {run_id}"


def interruptible(verb):
    """A verb that Ctrl-C ends with one line (exit 130, a shell's code for SIGINT), not a
    traceback."""
    import functools

    @functools.wraps(verb)
    def run(args) -> int:
        try:
            return verb(args)
        except Interrupted as e:
            console.print(f"[yellow]interrupted[/]: {escape(str(e))}", soft_wrap=True)
        except KeyboardInterrupt:  # before or after the sweep: no row was being written
            console.print("[yellow]interrupted[/] outside the sweep: rows already written stay "
                          "in the store")
        return 130
    return run


def run_one(w: Work, run_id: str, run_case, repeat: int, ledger) -> dict:
    """One (impl, case)'s row: `repeat` runs of it (valid cases), judged by the known-issues
    ledger (`gpu_impls/known_issues.py`): a never-launch entry's case does not run at all."""
    entry = known_issues.find(w.impl.id, w.case, ledger) if w.expect == "valid" else None
    if entry is not None and entry.kind == "never-launch":
        return quarantined_row(w, _backend(w.impl.backend).device(), run_id, entry)
    rows = [run_case(w, run_id)]
    if w.expect == "valid" and repeat > 1:
        while len(rows) < repeat and not is_failure(rows[-1]):  # a failed repeat decides
            rows.append(run_case(w, run_id))
        cached = rows[0].get(oracle_cache.CACHE_KEY)  # the first repeat's lookup speaks for it
        rows = [{k: v for k, v in r.items() if k != oracle_cache.CACHE_KEY} for r in rows]
        row = repeated_row(w.impl, rows, repeat)
        if cached is not None:
            row[oracle_cache.CACHE_KEY] = cached
    else:
        row = rows[0]
    return judged_row(row, entry) if entry is not None else row


# Columns shown only when some row of the run has that status.
RARE_STATUSES = ("timeout", "crash", "xfail", "xpass", "quarantined")


def summarize(rows: list[dict], run_id: str, store: Store, seed: int = 0) -> None:
    """The run's tables and its verdict line. Only what launched counts as a check: a violating
    case refused by its contract (as it should be) and a quarantined case are counted apart,
    and report-only impls (`Impl.report_only`: speed baselines computing another function)
    get a table of their own: their results are not the op's."""
    report_only = report_only_impls(rows)
    # a seeded run's ids are not the usual ones: say so where its results are read
    title = f"run {run_id}" + (f" (--seed {seed})" if seed else "")
    gated = [r for r in rows if r["impl"] not in report_only]
    if gated or not report_only:
        console.print(_outcome_table(title, gated, report_only={}))
    if report_only:
        console.print(_outcome_table("report-only impls (speed baselines, not gated)",
                                     [r for r in rows if r["impl"] in report_only], report_only))
    kinds = Counter(failure_kind(r) for r in rows
                    if outcome(r) in ("fail", "rejected") and gates(r, report_only))
    if kinds:
        console.print("fail, by kind: " + ", ".join(f"{n} {k}" for k, n in kinds.most_common()))
    _print_reported(rows)
    console.print(verdict_line(rows, report_only) + f"; rows in {store.root}/")


def report_only_impls(rows: list[dict]) -> dict[str, str]:
    """{impl id: why it is report-only} for the report-only impls among the rows' impls."""
    impls = _impls()
    return {i: impls[i].report_only for i in sorted({r["impl"] for r in rows})
            if i in impls and impls[i].report_only}


def gates(row: dict, report_only: dict[str, str]) -> bool:
    """Whether the row's verdict counts: a report-only impl's check of a valid case (run only by
    `repro`) computes another function than the op, so it is shown, never counted; its
    contract's refusals count like any impl's."""
    return not (row["impl"] in report_only and row["expect"] == "valid")


def failing(rows: list[dict], report_only: dict[str, str]) -> int:
    return sum(is_failure(r) and gates(r, report_only) for r in rows)


def _outcome_table(title: str, rows: list[dict], report_only: dict[str, str]) -> Table:
    """Per impl: its rows by outcome; for gated impls the largest budget and the ULP distance
    at that row's worst element, for report-only impls why they are."""
    table = Table(title=title)
    rare = [s for s in RARE_STATUSES if any(r["status"] == s for r in rows)]
    columns = ("pass", "fail", "error", *rare, "rejected ok")
    if report_only:  # only the outcomes they had (refusals, as a rule): no gate rows of zeros
        had = {"fail" if outcome(r) == "rejected" else outcome(r) for r in rows}
        columns = tuple(c for c in columns if c in had)
    extra = ("why",) if report_only else ("max budget", "ulp @ worst")
    for col in ("impl", "device", *columns, *extra):
        table.add_column(col, justify="left" if col in ("impl", "device", "why") else "right",
                         no_wrap=col == "impl")
    by_impl = defaultdict(list)
    for r in rows:
        by_impl[r["impl"]].append(r)
    for impl, rs in sorted(by_impl.items()):
        # an unexpected rejection (`outcome` "rejected") is counted with the failures
        c = Counter("fail" if outcome(r) == "rejected" else outcome(r) for r in rs)
        style = "red" if any(is_failure(r) and gates(r, report_only) for r in rs) else "green"
        if report_only:  # the reason's first clause: the whole is in `kparity ops`
            cells = (escape(report_only[impl].split(": ")[0]),)
        else:
            judged = [r for r in rs if r["budget"] is not None]
            worst = max(judged, key=lambda r: r["budget"]) if judged else None
            cells = (budget_text(worst and worst["budget"]), _ulp_at_worst(worst))
        table.add_row(f"[{style}]{impl}[/]", rs[0]["device"], *(str(c[col]) for col in columns),
                      *cells)
    return table


def _ulp_at_worst(row: dict | None) -> str:
    """The ULP distance at the element that set the row's budget (`metrics.compare`'s
    `worst_ulp`), "-" where there is none: no finite budget (an unwritten output's NaN has no
    ULP distance), an exact output, a row stored before the metric existed. Never the row's
    `max_ulp`, which near-zero outputs make huge on passing cases."""
    if row is None or not math.isfinite(row["budget"]):
        return "-"
    metrics = json.loads(row["outputs_json"] or "{}").get(row["worst_output"], {})
    ulp = metrics.get("worst_ulp")
    return "-" if ulp is None else str(ulp)


def verdict_line(rows: list[dict], report_only: dict[str, str]) -> str:
    """`OK`/`FAILED`: checks launched and failing; then, apart, what never launched (violating
    cases refused by contract as they should be, ledger quarantines) and the report-only impls."""
    n_fail = failing(rows, report_only)
    launched = sum(r["status"] not in ("rejected", "quarantined") for r in rows)
    refused = sum(outcome(r) == "rejected ok" for r in rows)
    quarantined = sum(r["status"] == "quarantined" for r in rows)
    parts = [f"{launched} {_plural(launched, 'check')} launched, {n_fail} failing"]
    if refused:
        parts.append(f"{refused} violating {_plural(refused, 'case')} refused by contract, "
                     "as expected")
    if quarantined:
        parts.append(f"{quarantined} quarantined (known issues, not launched)")
    if report_only:
        parts.append(f"{len(report_only)} report-only {_plural(len(report_only), 'impl')} "
                     "(not gated)")
    return ("[red]FAILED[/]" if n_fail else "[green]OK[/]") + ": " + "; ".join(parts)


def _plural(n: int, word: str) -> str:
    return word if n == 1 else word + "s"


def _print_reported(rows: list[dict]) -> None:
    """What the checks recorded but never gate on, one section per comparator summary
    (`oracle/comparators.py`: logit agreement, top-k near-ties, the level-2 loss...), one line
    per impl. Printed only when some output carries such metrics."""
    by_impl = defaultdict(lambda: defaultdict(list))
    for r in rows:
        for metrics in json.loads(r.get("outputs_json") or "{}").values():
            for section in SUMMARIES:
                if section.key in metrics:
                    by_impl[r["impl"]][section.key].append(metrics)
    used = [s for s in SUMMARIES if any(s.key in got for got in by_impl.values())]
    if not used:
        return
    titles = [s.title for s in used]
    table = Table(title="reported, not gated: " + " and ".join(
        filter(None, (", ".join(titles[:-1]), titles[-1]))))
    for col in ("impl", *(c for s in used for c in s.columns)):
        table.add_column(col, justify="left" if col == "impl" else "right", no_wrap=col == "impl")
    for impl, got in sorted(by_impl.items()):
        table.add_row(impl, *(c for s in used for c in s.cells(got.get(s.key, []))))
    console.print(table)


@interruptible
def cmd_check(args) -> int:
    if args.repeat < 1:
        raise UsageError(f"--repeat {args.repeat}: at least 1")
    if args.maxfail is not None and args.maxfail < 1:
        raise UsageError(f"--maxfail {args.maxfail}: at least 1 (-x is --maxfail 1)")
    if args.resume:
        return resume_check(args)
    impls = select_impls(args, need_available=True)
    work = work_list(args, impls)
    if not work:
        console.print("[red]no cases match the filters[/]")
        return 3
    rows = run_work(args, work, "check")
    write_check(args, rows)
    return 1 if any(is_failure(r) for r in rows) else 0


def resume_check(args) -> int:
    """`check --resume RUN_ID`: the killed run's filters (from its `runs` row), its journaled
    rows made parts, then only the (impl, case) pairs it has no row for, under the same run id.
    `--resume last`: the store's newest check run."""
    import pyarrow.compute as pc

    store = Store(args.store)
    checks = {r["run_id"]: r for r in store.read("runs").to_pylist() if r["verb"] == "check"}
    if args.resume == "last":
        if not checks:
            raise UsageError(f"--resume last: the store {store.root} holds no check run")
        args.resume = max(checks.values(), key=lambda r: (r["started"], r["run_id"]))["run_id"]
    if args.resume not in checks:
        raise unknown("check run", args.resume, checks)
    stored = json.loads(checks[args.resume]["filters"] or "{}")
    defaults = vars(parser().parse_args(["check"]))  # a flag left at its default: not given
    for key in FILTERS:
        given, was = getattr(args, key, None), stored.get(key)
        if given != defaults[key] and given != was:
            raise UsageError(f"--resume {args.resume}: --{key.replace('_', '-')} {given} differs "
                             f"from the run's own ({was}); give no filters to reuse the run's")
        setattr(args, key, was if was is not None else defaults[key])
    recovered = store.recover("correctness", args.resume)
    kept = store.read("correctness", filter=pc.field("run_id") == args.resume).to_pylist()
    done = {(r["impl"], r["case_id"], r["expect"]) for r in kept}
    work = [w for w in work_list(args, select_impls(args, need_available=True))
            if (w.impl.id, w.case.id, w.expect) not in done]
    console.print(f"resuming run {args.resume}: {len(kept)} rows kept ({recovered} recovered "
                  f"from its journal), {len(work)} to run")
    rows = run_work(args, work, "check", resume=args.resume, kept=kept)
    write_check(args, rows, args.resume)
    return 1 if any(is_failure(r) for r in rows) else 0


def find_case(case_id: str, store: Store) -> tuple[Case, list[str]]:
    """The case with this id, from the store (and the impls that ran it) or the generators."""
    import pyarrow.compute as pc

    table = store.read("correctness", filter=pc.field("case_id") == case_id)
    if table.num_rows:
        rows = table.to_pylist()
        return Case.from_json(rows[-1]["case_json"]), sorted({r["impl"] for r in rows})
    for impl in _impls().values():
        for c in valid_cases(impl) + [w.case for w in violating_cases(impl)]:
            if c.id == case_id:
                return c, []
    raise UsageError(f"case {case_id!r} is neither in the store ({store.root}) nor among the "
                     f"generated cases (seed 0); `kparity cases --list` shows ids")


@interruptible
def cmd_repro(args) -> int:
    store = Store(args.store)
    case, ran = find_case(args.case_id, store)
    ids = _split(args.impl) or ran or sorted(i.id for i in _impls().values() if i.op == case.op)
    impls = _impls()
    for i in ids:
        if i not in impls:
            raise unknown("impl", i, impls)
    console.print(escape(f"case {case.id}: {case.short()} params {case.params} ({case.label})"))
    work = [work_for(impls[i], case) for i in ids]
    for w in work:  # asked for by id: run it whatever the ledger says, and say so
        entry = known_issues.find(w.impl.id, case, known_issues.ledger())
        if entry is not None:
            console.print(escape(f"{w.impl.id}: {entry.describe()}, from {entry.source}: "
                                 "run anyway (repro ignores the ledger)"))
    rows = run_work(args, work, "repro", use_ledger=False)
    for r in rows:
        console.print(f"[bold]{r['impl']}[/] {r['status']}: {escape(r['message'])}")
        for name, m in json.loads(r["outputs_json"]).items():
            console.print(f"  {name}: {describe(case.spec, name, m)}")
    if args.dump:
        from runners.repro_dump import dump

        script, statuses = dump(case, work, args.plugin or [], args.dump)
        for r in rows:  # the dump's own run (in this process) disagreeing would be news
            if statuses[r["impl"]] != r["status"]:
                console.print(f"[yellow]{r['impl']}: {statuses[r['impl']]} in the dump's run, "
                              f"{r['status']} above[/] (nondeterministic?)")
        console.print(escape(f"dumped inputs, outputs, oracle and bounds (.npy) to {args.dump}/;"
                             f" rerun without the CLI: python {script}"), soft_wrap=True)
    return 1 if failing(rows, report_only_impls(rows)) else 0


# --- parser ------------------------------------------------------------------------------------

def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", action="append", help="op name (repeatable, comma-separated)")
    p.add_argument("--impl", action="append", help="impl id backend:name, or name")
    p.add_argument("--backend", action="append", help="cuda, torch, mlx, metal")
    p.add_argument("--dtype", action="append", help="f32, f16, bf16")
    p.add_argument("--preset", action="append",
                   help="case label substring: a model preset, 'edge' or 'violates'")


def _seed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="fresh data: add N to every generated case's seed (sources give 0, so it "
                        "becomes N), which changes each case's id and inputs; 0 (default) keeps "
                        "the usual ids. Not with --cases (a file's cases keep their seeds)")


def _global_options(p: argparse.ArgumentParser, after_verb: bool) -> None:
    """--store and --plugin, on the top-level parser and (after_verb) on every verb's. A verb's
    parser fills its own namespace, which then overwrites the top level's: after the verb they
    have no default (SUPPRESS), so an option given only before the verb survives, and --plugin
    lands in `plugin_after`, which `parse_args` appends to the plugins given before the verb."""
    default = argparse.SUPPRESS if after_verb else None
    p.add_argument("--store", default=default, metavar="DIR",
                   help="result store (default: .kparity here, or $KPARITY_STORE)")
    p.add_argument("--plugin", action="append", default=default, metavar="MODULE",
                   dest="plugin_after" if after_verb else "plugin",
                   help="load a plugin first: a dotted module importable from here "
                        "(tests.mutants) or a .py file (tests/mutants.py) that registers ops "
                        "or impls; repeatable. Installed `kparity.plugins` entry points load "
                        "without it")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kparity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(p, after_verb=False)
    sub = p.add_subparsers(title="verbs", dest="verb", required=True, metavar="VERB")
    ops = sub.add_parser("ops", help="ops, impls (and where each came from), backends here")
    ops.add_argument("--matrix", action="store_true",
                     help="support matrix, op x impl x dtype: runs here (how many of the op's "
                          "cases of that dtype the impl's contract admits), refused by "
                          "contract (and the invariant), or backend missing (and why)")
    cases = sub.add_parser("cases", help="what would run: (impl, case) pairs, per impl")
    _filters(cases)
    cases.add_argument("--invalid", action="store_true",
                       help="include the violating cases (one per contract invariant)")
    cases.add_argument("--list", action="store_true",
                       help="print each case: id, impl, op[dims] dtype distribution, its "
                            "params, label")
    cases.add_argument("--limit", type=int, default=200, metavar="N",
                       help="print at most N cases with --list (200)")
    _seed(cases)
    chk = sub.add_parser("check", help="correctness sweep against the oracles")
    _filters(chk)
    chk.add_argument("--valid-only", action="store_true", help="skip the violating cases")
    chk.add_argument("--show-failures", type=int, default=20, metavar="N",
                     help="failures printed in full, with their repro line (20)")
    chk.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="run every case N times: a failure in any repeat fails it, and bits "
                          "that differ between repeats fail impls declaring determinism")
    chk.add_argument("--cases", metavar="FILE", default=None,
                     help="JSON list of cases (op, dims, dtype; dist, seed, params, label) run "
                          "against every selected impl of their op, instead of the generated "
                          "ones")
    _seed(chk)
    chk.add_argument("--resume", metavar="RUN_ID", default=None,
                     help="continue a killed, interrupted or stopped check run (its filters, "
                          "its run id): only the cases it has no row for; 'last': the store's "
                          "newest check run")
    chk.add_argument("--maxfail", type=int, default=None, metavar="N",
                     help="stop after N failing rows; the rows so far are kept and --resume "
                          "runs the rest")
    chk.add_argument("-x", "--exitfirst", dest="maxfail", action="store_const", const=1,
                     help="stop at the first failing row (--maxfail 1)")
    add_output_flags(chk, "(impl, case)")
    rep = sub.add_parser("repro", help="rerun one case (from the store or the generators)")
    rep.add_argument("case_id", help="the 12-hex case id a failure line, the store or "
                                     "`kparity cases --list` shows")
    rep.add_argument("--impl", action="append",
                     help="impl id(s) to run it on (repeatable, comma-separated); default: the "
                          "impls that ran it in the store, else every impl of its op")
    rep.add_argument("--show-failures", type=int, default=20, metavar="N",
                     help="failures printed in full (20)")
    rep.add_argument("--dump", metavar="DIR", default=None,
                     help="also write the case's inputs, each impl's outputs, the oracle (exact, "
                          "rounded) and bounds as .npy, and repro_<case>.py, a script that "
                          "reruns the case without the CLI (the impls run again, in process)")
    for verb_parser in (chk, rep):
        verb_parser.add_argument(
            "--isolate", choices=ISOLATION_MODES, default="auto",
            help="run cases in worker processes: case (one worker at a time, a hang or a "
                 "crash becomes that case's row), impl (one worker per impl), none; auto: "
                 "case on GPU backends, none on CPU")
        verb_parser.add_argument("--case-timeout", type=float, default=None, metavar="SECONDS",
                                 help="per-case limit in a worker (default: from the case)")
    from verbs import history, report, timing

    for module in (timing, history, report):
        module.add_parsers(sub, _filters)
    for verb_parser in sub.choices.values():
        _global_options(verb_parser, after_verb=True)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """The parsed command line, --plugin values from before and after the verb together."""
    args = parser().parse_args(argv)
    args.plugin = (args.plugin or []) + vars(args).pop("plugin_after", []) or None
    return args


def _verb(module: str, name: str):
    """The verb `name` of verbs/<module>.py, imported only when it runs."""
    def run(args):
        import importlib

        return getattr(importlib.import_module(f"verbs.{module}"), f"cmd_{name}")(args)
    return run


VERBS = {"ops": cmd_ops, "cases": cmd_cases, "check": cmd_check, "repro": cmd_repro,
         "bench": _verb("timing", "bench"), "ab": _verb("timing", "ab"),
         "compare": _verb("history", "compare"), "accept": _verb("history", "accept"),
         "sql": _verb("history", "sql"), "report": _verb("report", "report"),
         "nightly": _verb("report", "nightly")}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        with plugin_warnings_in_yellow():
            load_plugins(args.plugin or [])
            return VERBS[args.verb](args)
    except UsageError as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except (StoreError, CaseFileError, known_issues.KnownIssueError) as e:
        console.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        return 2
    except DeviceUnusable as e:  # rows so far are in the store; --resume runs the rest
        console.print(f"[red]stopped:[/] {escape(str(e))}", soft_wrap=True)
        return 1


def load_plugins(modules: list[str]) -> None:
    """The --plugin modules, in order; one that fails to load is bad input (exit 2)."""
    import gpu_impls

    for module in modules:
        try:
            gpu_impls.load_plugin(module)
        except gpu_impls.PluginError as e:
            hint = ("; --plugin takes a module importable from here (tests.mutants) or a .py "
                    "file (tests/mutants.py)"
                    if isinstance(e.__cause__, (ImportError, OSError)) else "")
            raise UsageError(f"{e}{hint}") from None


@contextlib.contextmanager
def plugin_warnings_in_yellow():
    """An entry-point plugin that failed to load (`gpu_impls.PluginWarning`, warned wherever
    impls are first listed) as one yellow line each; other warnings as Python shows them."""
    import warnings

    import gpu_impls

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, gpu_impls.PluginWarning):
            console.print(f"[yellow]plugin not loaded:[/] {escape(str(message))}",
                          soft_wrap=True)
        else:
            show_other(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():  # restores the filters and showwarning on the way out
        warnings.simplefilter("always", gpu_impls.PluginWarning)
        show_other, warnings.showwarning = warnings.showwarning, show
        yield


if __name__ == "__main__":
    # `python -m verbs.cli`: run the imported module's main, so the exceptions other modules
    # raise (verbs.cli.UsageError) are the classes main catches, not __main__'s copies
    from verbs.cli import main as imported_main

    sys.exit(imported_main())
