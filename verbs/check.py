"""`kparity check` (every selected impl over its op's cases against the oracle, rows to the store)
and `kparity repro` (one case by id): the sweep, its summary tables and verdict line, Ctrl-C and
`--resume`."""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter, defaultdict

from rich.markup import escape
from rich.table import Table

from cases.generate import Work, gate_cases, valid_cases, violating_cases
from cases.model import Case
from gpu_impls import known_issues
from oracle.comparators import SUMMARIES, describe
from oracle.metrics import budget_text
from results.runinfo import new_run_id, run_row
from results.store import RowWriter, Store
from runners import oracle_cache
from runners.isolation import MODES as ISOLATION_MODES
from runners.sweep import runner_for
from runners.item import run_one  # noqa: F401 (run_work calls it by this module's name)
from runners.verdicts import failure_kind, is_failure, outcome
from verbs.console import SweepProgress, console, time_line
from verbs.selection import (FILTERS, add_filter_args, add_seed_arg, backend_named, check_presets,
                             devices_flag, global_flags, open_store, pick_devices,
                             registered_impls, repro_line, say_left_out, select_impls,
                             tier_flag, verbose_flag, work_for, work_list)
from verbs.stops import Interrupted, interruptible, resume_command
from verbs.usage import UsageError, split_csv, unknown
from verbs.outputs import add_flags as add_output_flags, write_check

ORDER = 1  # after ops and cases in `kparity --help`
GROUP = "correctness"  # its heading in `kparity --help`


def add_parsers(sub) -> None:
    chk = sub.add_parser("check", help="correctness sweep against the oracles")
    add_filter_args(chk)
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
    add_seed_arg(chk)
    tier_flag(chk)
    chk.add_argument("--resume", metavar="RUN_ID", default=None,
                     help="continue a killed, interrupted or stopped check run (its filters, "
                          "its run id): only the cases it has no row for; 'last': the store's "
                          "newest check run")
    chk.add_argument("--maxfail", type=int, default=None, metavar="N",
                     help="stop after N failing rows; the rows so far are kept and --resume "
                          "runs the rest")
    chk.add_argument("-x", "--exitfirst", dest="maxfail", action="store_const", const=1,
                     help="stop at the first failing row (--maxfail 1)")
    chk.add_argument("--since", metavar="REF", default=None,
                     help="only the impls whose code (impl, kernel, oracle, cases) changed since "
                          "git ref REF, uncommitted changes included; a core change: all")
    devices_flag(chk)
    verbose_flag(chk)
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
    chk.add_argument("--ray", metavar="ADDRESS", default=None, type=ray_address,
                     help="run the cases as tasks on a Ray cluster (pip install "
                          "'kparity[ray]'): its address, auto (the cluster of this host), or "
                          "local (start one here, 2 CPUs); rows stream back to this process")
    chk.add_argument("--ray-retries", type=at_least_0, default=None, metavar="N",
                     help="with --ray: reruns of a task whose worker died (2); a batch that "
                          "still kills it is split, and a case that alone does is a crash row")


def at_least_0(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text}: a count, 0 or more")
    return int(text)


def ray_address(text: str) -> str:
    """--ray's value, refused at once where Ray is not installed (exit 2)."""
    from runners.ray_sweep import available

    if not available():
        raise argparse.ArgumentTypeError(f"{text}: Ray is not installed here; "
                                         "pip install 'kparity[ray]'")
    return text


def run_work(args, work: list[Work], verb: str, resume: str | None = None,
             kept: list[dict] | None = None, use_ledger: bool = True) -> list[dict]:
    """Run the work list, writing rows to the store as it goes; returns the rows (with `kept`,
    the rows a resumed run already had). `use_ledger=False`: known issues are not applied."""
    ledger = known_issues.ledger() if use_ledger else []  # a malformed entry stops here
    for entry in known_issues.unmatched(ledger, registered_impls()):
        console.print(escape(f"ledger: {entry.source} names impl {entry.impl!r}, which matches "
                             "no impl here (stale entry, or a typo)"), style="yellow")
    store = open_store(args)
    store.ensure_writable()
    run_id = resume or new_run_id()
    if not resume:
        backends = sorted({w.impl.backend for w in work})
        devices = {b: backend_named(b).device() for b in backends}
        versions = {k: v for b in backends for k, v in backend_named(b).versions().items()}
        filters = {k: getattr(args, k, None) for k in FILTERS}
        store.write("runs", [run_row(run_id, verb, devices, versions, filters)], run_id, 0)

    rows = list(kept or [])
    maxfail = getattr(args, "maxfail", None)
    first_part = store.next_part("correctness", run_id)
    failed = done = 0
    first_row = last_row = None  # when the first and the last row came (the time line)
    cached = Counter()  # the oracle cache's outcome per row (runners/oracle_cache.py)
    try:
        with RowWriter(store, "correctness", run_id, first_part=first_part) as writer, \
                oracle_prefetch(args, work) as ahead, \
                runner_for(args, work, say=console.print) as executor, \
                SweepProgress(verb, "failed", " failed") as progress:
            task = progress.add_task(verb, total=len(work), failed=0)
            repeat = getattr(args, "repeat", None) or 1

            def one(w: Work, run_case) -> dict:
                """`w`'s row, its oracle cache outcome under CACHE_KEY (called by the
                executor, from any of its threads)."""
                progress.update(task, description=f"{w.impl.id} {w.case.dtype}")
                computed_ahead = ahead.wait(w)  # its oracle entries, if the pool has them
                row = run_one(w, run_id, run_case, repeat, ledger)
                if row.get(oracle_cache.CACHE_KEY) is not None and computed_ahead:
                    row[oracle_cache.CACHE_KEY] = computed_ahead
                return row

            for w, row in executor(work, one):  # rows as they complete; this loop writes them
                last_row = time.monotonic()
                first_row = first_row or last_row
                outcome_of_cache = row.pop(oracle_cache.CACHE_KEY, None)
                if outcome_of_cache is not None:
                    cached[outcome_of_cache] += 1
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
                if maxfail is not None and failed >= maxfail:
                    break  # closes the executor: nothing more starts
    except KeyboardInterrupt as e:  # the writer has closed: every finished row is in a part
        raise Interrupted(args, verb, run_id, store, e) from None
    summarize(rows, run_id, store, getattr(args, "seed", 0))
    if cached:
        console.print(escape(oracle_cache.summary(cached, ahead)), soft_wrap=True)
    console.print(escape(time_line(first_row, last_row, rows[len(kept or []):])), soft_wrap=True)
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

    if getattr(args, "ray", None):  # the tasks' hosts compute (and cache) their own
        work = []
    try:
        return oracle_cache.Prefetch(work, backend_named, getattr(args, "plugin", None) or [])
    except CacheConfigError as e:
        raise UsageError(str(e)) from None


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
    impls = registered_impls()
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
    """Per impl: its rows by outcome; for gated impls the budget's spread over its judged rows
    (`_budget_spread`) and the ULP distance at the largest budget's element (`_ulp_at_worst`),
    for report-only impls why they are."""
    table = Table(title=title)
    rare = [s for s in RARE_STATUSES if any(r["status"] == s for r in rows)]
    columns = ("pass", "fail", "error", *rare, "rejected ok")
    if report_only:  # only the outcomes they had (refusals, as a rule): no gate rows of zeros
        had = {"fail" if outcome(r) == "rejected" else outcome(r) for r in rows}
        columns = tuple(c for c in columns if c in had)
    extra = ("why",) if report_only else (BUDGET_COLUMN, "ulp @ worst")
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
            worst = max(judged, key=lambda r: _budget_key(r["budget"])) if judged else None
            cells = (_budget_spread([r["budget"] for r in judged]), _ulp_at_worst(worst))
        table.add_row(f"[{style}]{impl}[/]", rs[0]["device"], *(str(c[col]) for col in columns),
                      *cells)
    return table


BUDGET_COLUMN = "budget p50 / p99 / max"
BUDGET_QUANTILES = (0.5, 0.99)


def _budget_key(budget: float) -> float:
    """A budget's place in an order: NaN (no row should carry one) counts as the worst."""
    return math.inf if math.isnan(budget) else budget


def _budget_spread(budgets: list[float]) -> str:
    """The budgets of an impl's judged rows (every row compared with the oracle, passing or
    failing) as "p50 / p99 / max", each by `budget_text` (never 1 unless it is 1); "-" where no
    row was judged. Nearest-rank percentiles: each is some row's own budget, the smallest one
    at or above that share of the rows (p50 of [0.1, 0.2, 0.9] is 0.2; p99 of fewer than 100
    rows is their max), so a pass is never averaged with a failure into a value no row has."""
    if not budgets:
        return "-"
    ranked = sorted(budgets, key=_budget_key)
    picks = [ranked[max(math.ceil(q * len(ranked)), 1) - 1] for q in BUDGET_QUANTILES]
    return " / ".join(budget_text(b) for b in (*picks, ranked[-1]))


def _ulp_at_worst(row: dict | None) -> str:
    """The ULP distance at the element that set the row's budget (`metrics.compare`'s
    `worst_ulp`), counted only where that element's |exact| is above its bound: where the
    bound reaches zero (an absolute floor: cancellation to near zero, sin/cos's absolute error,
    a flush, an overflowed sum), every value down to 0 and past it is admissible and a ULP
    count there measures how near zero the value is, not how wrong (billions, at budgets below
    1). "-" there and where there is no distance: no finite budget (an unwritten output's NaN
    has none), an output judged without element-wise metrics, a row stored before the metric
    existed. A distance of 0 shows at any magnitude. Never the row's `max_ulp`, which near-zero
    outputs make huge on passing cases."""
    if row is None or not math.isfinite(row["budget"]):
        return "-"
    metrics = json.loads(row["outputs_json"] or "{}").get(row["worst_output"], {})
    ulp = metrics.get("worst_ulp")
    if ulp is None:
        return "-"
    exact, bound = metrics.get("worst_exact"), metrics.get("worst_bound")
    if ulp and (exact is None or bound is None or not abs(exact) > bound):
        return "-"
    return str(ulp)


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
        if args.since:
            raise UsageError("--since with --resume: a resumed run keeps its own impls")
        return resume_check(args)
    changed = None
    if args.since:  # read first: a bad ref is refused before anything else is said
        from runners.since import ROOT, changed_files
        changed = changed_files(args.since, ROOT, "--since")
    if not args.cases:
        check_presets(args)  # a bad --preset is refused before anything else is said
    impls = select_impls(args, need_available=True)
    if args.since:  # one more filter: the impls the changes since REF can affect
        from verbs.selection import since_filter
        if not (impls := since_filter(args, impls, changed)):
            return 0
    work = work_list(args, impls)
    if not work:
        console.print("[red]no cases match the filters[/]")
        return 3
    pick_devices(args, {w.impl.backend for w in work})
    if not getattr(args, "cases", None):  # a case file says so itself (case_file_work)
        say_unchecked(args, impls, work)
        if args.tier == "commit":
            console.print(f"commit tier: {len(work)} (impl, case) pairs, each impl's smallest "
                          "cases covering what its gate cases show; --tier nightly runs every "
                          "one", style="dim", soft_wrap=True)
    rows = run_work(args, work, "check")
    write_check(args, rows)
    return 1 if failing(rows, report_only_impls(rows)) else 0


def say_unchecked(args, impls, work) -> None:
    """Each selected impl (not a report-only baseline: those only run their rejections) that
    gets no valid case, with the reason: never left out without a word (`say_left_out`: one
    line counting them by reason unless few, or --verbose)."""
    from verbs.timing import why_no_cases

    checked = {w.impl.id for w in work if w.expect == "valid"}
    seed = getattr(args, "seed", 0) or 0
    whys = {impl.id: why_no_cases(impl, gate_cases(impl.op, seed), split_csv(args.dtype) or None,
                                  check_presets(args) or None, "gate")
            for impl in impls if impl.id not in checked and not impl.report_only}
    say_left_out("not checked", whys, args.verbose)


def resume_check(args) -> int:
    """`check --resume RUN_ID`: the killed run's filters (from its `runs` row), its journaled
    rows made parts, then only the (impl, case) pairs it has no row for, under the same run id.
    `--resume last`: the store's newest check run."""
    import pyarrow.compute as pc

    store = open_store(args)
    checks = {r["run_id"]: r for r in store.read("runs").to_pylist() if r["verb"] == "check"}
    if args.resume == "last":
        if not checks:
            raise UsageError(f"--resume last: the store {store.root} holds no check run")
        args.resume = max(checks.values(), key=lambda r: (r["started"], r["run_id"]))["run_id"]
    if args.resume not in checks:
        raise unknown("check run", args.resume, checks)
    stored = json.loads(checks[args.resume]["filters"] or "{}")
    stored.setdefault("tier", "nightly")  # a run from before the tiers ran every gate case
    defaults = check_defaults()  # a flag left at its default: not given
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
    pick_devices(args, {w.impl.backend for w in work})
    console.print(f"resuming run {args.resume}: {len(kept)} rows kept ({recovered} recovered "
                  f"from its journal), {len(work)} to run")
    rows = run_work(args, work, "check", resume=args.resume, kept=kept)
    write_check(args, rows, args.resume)
    return 1 if failing(rows, report_only_impls(rows)) else 0


def check_defaults() -> dict:
    """`kparity check`'s options at their defaults, from this module's own parsers."""
    sub = argparse.ArgumentParser().add_subparsers(dest="verb")
    add_parsers(sub)
    return vars(sub.choices["check"].parse_args([]))


def find_case(case_id: str, store: Store) -> tuple[Case, list[str]]:
    """The case with this id, from the store (and the impls that ran it) or the generators."""
    import pyarrow.compute as pc

    table = store.read("correctness", filter=pc.field("case_id") == case_id)
    if table.num_rows:
        rows = table.to_pylist()
        return Case.from_json(rows[-1]["case_json"]), sorted({r["impl"] for r in rows})
    for impl in registered_impls().values():
        for c in valid_cases(impl) + [w.case for w in violating_cases(impl)]:
            if c.id == case_id:
                return c, []
    raise UsageError(f"case {case_id!r} is neither in the store nor among the generated cases "
                     f"(seed 0)\n  `kparity cases --list` shows ids; the store: {store.root}")


@interruptible
def cmd_repro(args) -> int:
    store = open_store(args)
    case, ran = find_case(args.case_id, store)
    ids = split_csv(args.impl) or ran or sorted(
        i.id for i in registered_impls().values() if i.op == case.op)
    impls = registered_impls()
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


VERBS = {"check": cmd_check, "repro": cmd_repro}
