"""`kparity compare`, `kparity accept`, `kparity sql`: the store as the memory of a kernel project.

compare  run against run (default: the latest two runs of the same device kind), or a run against
         the last N runs (`--baseline N`): correctness changes and speed changes per (impl, case);
         exit 1 on a regression, so it can gate CI.
accept   writes an annotation row: from that run on, the matching series start a new baseline.
         Accept is for speed and error-budget baselines, never for a correctness failure: it
         refuses (exit 2) a target whose newest sweep has failing correctness rows, naming
         them, unless `--metric median_ns` (speed only) is asked. A known failure goes into the
         known-issues ledger (gpu_impls/known_issues.py) with its tracked issue. Refusing is
         clearer than accepting the rest quietly: the failures stay red until fixed or ledgered.
sql      ad-hoc DuckDB queries over the Parquet datasets (views: docs/results-schema.md).

Heavy imports (DuckDB) happen inside the verbs: none of this is on the GPU import path.
"""

from __future__ import annotations

from cases.casefile import closest
from verbs.console import console
from verbs.selection import add_filter_args, open_store
from verbs.usage import LINE, UsageError, split_csv, unknown

ORDER = 3  # after the timing and model verbs in `kparity --help`
GROUP = "history"  # its heading in `kparity --help`


def add_parsers(sub) -> None:
    cmp = sub.add_parser("compare", help="run vs run, or vs the last N runs: regressions, exit 1")
    cmp.add_argument("run_a", nargs="?",
                     help="run A (default: the newest run before B of its device kind with rows "
                          "of B's tables); with --baseline, the contender")
    cmp.add_argument("run_b", nargs="?", help="run B, the contender (default: the newest)")
    cmp.add_argument("--baseline", type=int, default=None, metavar="N",
                     help="compare the contender with the last N runs as history")
    add_filter_args(cmp)
    cmp.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                     help="table (terminal), json (results/compare.schema.json, for bots) or "
                          "markdown (a PR comment)")
    cmp.add_argument("--z", type=float, default=5.0, help="lookback z-score threshold (5)")
    cmp.add_argument("--min-change", type=float, default=0.05,
                     help="smallest relative change that counts (0.05)")
    cmp.add_argument("--budget-jump", type=float, default=2.0,
                     help="error budget ratio that counts as a correctness regression (2)")
    cmp.add_argument("--new-may-fail", action="store_true",
                     help="cases new in B (in no history run with --baseline) may fail: listed "
                          "as accepted, not regressions (a mutant's or a new kernel's check)")
    acc = sub.add_parser("accept", help="accept a speed or error-budget change: reset the "
                                        "baseline of an impl or case (not a correctness failure)")
    acc.add_argument("target", help="impl id (backend:name) or case id")
    acc.add_argument("--reason", required=True,
                     help="why the change is accepted (kept in the annotation, shown by compare "
                          "and report)")
    acc.add_argument("--run", default=None, help="first run of the new baseline (default: newest)")
    acc.add_argument("--metric", default="", choices=("", "median_ns", "budget"),
                     help="only this metric's series (default: every metric)")
    sql = sub.add_parser(
        "sql", help="a DuckDB query over the store",
        description="One DuckDB query over the store's Parquet datasets. Views: runs, "
                    "correctness, bench, ab, ceilings, annotations (one per table), latest (the "
                    "newest correctness row of each impl, case and device; repro runs and "
                    "retired impls left out), history (one value per run and series). docs/"
                    "results-schema.md documents them.")
    sql.add_argument("query", help="SQL text, e.g. \"SELECT impl, count(*) FROM latest GROUP BY "
                                   "impl\"")
    sql.add_argument("--format", choices=("table", "csv", "json"), default="table",
                     help="table (terminal), csv or json (one object per row)")


def cmd_compare(args) -> int:
    """Exit 1 on a regression (rules: results/compare.py), 0 otherwise, 2 on bad input."""
    import json
    import sys

    from results.compare import Thresholds, compare
    from results.compare_render import render_markdown, render_table
    from results.compare_runs import FILTERS, CompareError

    thresholds = Thresholds(z=args.z, min_change=args.min_change, budget_jump=args.budget_jump,
                            new_may_fail=args.new_may_fail)
    filters = {k: split_csv(getattr(args, k)) for k in FILTERS}
    try:
        report = compare(open_store(args), args.run_a, args.run_b, baseline=args.baseline,
                         filters=filters, thresholds=thresholds)
    except CompareError as e:
        if e.given is not None:
            raise unknown(e.kind, e.given, e.valid) from None
        raise UsageError(str(e)) from None
    if args.format == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    elif args.format == "markdown":
        sys.stdout.write(render_markdown(report) + "\n")
    else:
        render_table(report, console)
    return 1 if report["regression"] else 0


ACCEPT_TABLES = {"": ("correctness", "bench"), "budget": ("correctness",),
                 "median_ns": ("bench",)}
SHOWN_FAILURES = 10


def failing_now(store, target: str) -> tuple[str | None, list[dict]]:
    """(the newest sweep with correctness rows of `target` (an impl or a case id), its failing
    rows of the target). Repro runs are no sweep: a rerun without the ledger is not the state."""
    from runners.verdicts import is_failure

    repro = {r["run_id"] for r in store.read("runs").select(["run_id", "verb"]).to_pylist()
             if r["verb"] == "repro"}
    rows = [r for r in store.read("correctness").select(
                ["run_id", "impl", "case_id", "label", "dtype", "expect", "status"]).to_pylist()
            if target in (r["impl"], r["case_id"]) and r["run_id"] not in repro]
    newest = max((r["run_id"] for r in rows), default=None)
    return newest, [r for r in rows if r["run_id"] == newest and is_failure(r)]


def refuse_failures(target: str, run_id: str, failing: list[dict]) -> str:
    """Why `accept` refuses a target with failing correctness rows (as many as fit a line), and
    what to do instead: accept never accepts a correctness failure; the known-issues ledger
    records a known one (with its tracked issue) as xfail."""
    head = (f"not accepted: {target} has {len(failing)} failing correctness case"
            f"{'s' if len(failing) != 1 else ''} in its newest sweep {run_id}: ")
    shown = []
    for r in failing[:SHOWN_FAILURES]:
        text = (f"{r['impl']} {r['case_id']} ({(r['label'] or '').split(':', 1)[-1]} "
                f"{r['dtype']}): {r['status']}")
        if shown and len(head + "; ".join([*shown, text])) > LINE - 14:
            break
        shown.append(text)
    more = f"; and {len(failing) - len(shown)} more" if len(failing) > len(shown) else ""
    return (head + "; ".join(shown) + more + "\n  fix it, or ledger it as a known issue "
            "(gpu_impls/known_issues.py); a speed change alone: kparity accept "
            f"{target} --metric median_ns --reason ...")


def cmd_accept(args) -> int:
    """One annotations row: from `--run` (default: the newest run with rows of the target, in
    the metric's table) on, the target's series start a new baseline, and the change is
    accepted (results/history.py, results/compare.py). Exit 2, writing nothing, when the
    target fails correctness cases in its newest sweep and the metric includes `budget`
    (`refuse_failures` says why and what to do)."""
    import shlex
    import socket
    from datetime import datetime, timezone

    from rich.markup import escape

    from results.runinfo import new_run_id

    store = open_store(args)
    runs_of: dict[str, set[str]] = {}  # target -> runs with rows of it (in the metric's tables)
    targets: set[str] = set()
    for table in ("correctness", "bench"):
        rows = store.read(table).select(["run_id", "impl", "case_id"]).to_pylist()
        for r in rows:
            for t in (r["impl"], r["case_id"]):
                targets.add(t)
                if table in ACCEPT_TABLES[args.metric]:
                    runs_of.setdefault(t, set()).add(r["run_id"])
    if args.target not in targets:
        raise UsageError(f"unknown target {args.target!r}: neither an impl id nor a case id in "
                         f"the store ({store.root})\n  closest first: "
                         + closest(args.target, targets, width=LINE - 16))
    if args.run is not None:
        known = set(store.read("runs").column("run_id").to_pylist())
        known |= {r for runs in runs_of.values() for r in runs}
        if args.run not in known:
            raise unknown("run", args.run, known)
        run_id = args.run
    elif args.target in runs_of:
        run_id = max(runs_of[args.target])
    else:
        raise UsageError(f"{args.target} has no {ACCEPT_TABLES[args.metric][0]} rows for "
                         f"--metric {args.metric}; pass --run RUN")
    if "correctness" in ACCEPT_TABLES[args.metric]:
        newest, failing = failing_now(store, args.target)
        if failing:
            raise UsageError(refuse_failures(args.target, newest, failing))
    store.ensure_writable()
    command = ["kparity", "accept", args.target, "--reason", args.reason]
    command += ["--run", args.run] if args.run else []
    command += ["--metric", args.metric] if args.metric else []
    row = {"run_id": run_id, "created": datetime.now(timezone.utc), "kind": "accept",
           "target": args.target, "metric": args.metric, "reason": args.reason,
           "command": shlex.join(command), "host": socket.gethostname()}
    store.write("annotations", [row], f"accept-{new_run_id()}", 0)
    console.print(escape(f"accepted {args.target} ({args.metric or 'every metric'}) from run "
                         f"{run_id} on: {args.reason}"))
    return 0


def cmd_sql(args) -> int:
    """Run one DuckDB query over the store's views and print the result."""
    import csv
    import io
    import json

    from rich.table import Table

    from results.query import query

    try:
        import duckdb
    except ImportError:
        raise UsageError("kparity sql needs DuckDB: pip install 'kparity[history]'") from None
    empty = UsageError("kparity sql: the query holds no statement; e.g. kparity sql "
                       "\"SELECT impl, count(*) FROM latest GROUP BY impl\"")
    if not args.query.strip():
        raise empty
    try:
        answer = query(open_store(args), args.query)
    except duckdb.Error as e:
        raise UsageError(f"query failed: {e}".splitlines()[0] + "\n  views: runs, correctness, "
                         "bench, ab, ceilings, annotations, latest, history") from None
    if answer is None:  # comments only
        raise empty
    columns, rows = answer
    if args.format == "json":
        print(json.dumps([dict(zip(columns, r)) for r in rows], default=str))
    elif args.format == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(columns)
        writer.writerows(rows)
        print(buffer.getvalue(), end="")
    else:
        table = Table(title=f"{len(rows)} rows")
        for c in columns:
            table.add_column(c)
        for r in rows:
            table.add_row(*("" if v is None else str(v) for v in r))
        console.print(table)
    return 0


VERBS = {"compare": cmd_compare, "accept": cmd_accept, "sql": cmd_sql}
