"""`kparity report` (a static, self-contained HTML dashboard of the store) and `kparity nightly`
(check + bench + compare against history + report, for a cron job or a CI schedule).

Plotting imports happen inside the verbs: none of this is on the GPU import path. Both verbs
need plotly (the `history` extra): without it they exit 2 naming the extra, and nightly says so
before its check runs, not after.
"""

from __future__ import annotations

from pathlib import Path

from verbs.console import console
from verbs.selection import (add_filter_args, backend_named, open_store, select_impls,
                             tier_flag, verbose_flag)
from verbs.usage import UsageError

ORDER = 4  # after compare, accept and sql in `kparity --help`
GROUP = "history"  # its heading in `kparity --help`
FILTERS = ("op", "impl", "backend", "dtype", "preset")
STOPPED = (130, 143)  # a step's exit code after Ctrl-C, SIGTERM: the night stops there too


def add_parsers(sub) -> None:
    rep = sub.add_parser("report", help="static HTML dashboard of the store")
    rep.add_argument("--out", required=True, help="output folder (created)")
    rep.add_argument("--baseline", type=int, default=20,
                     help="runs of history for the regression page (20)")
    nightly = sub.add_parser("nightly", help="check + bench + compare + report")
    add_filter_args(nightly)
    nightly.add_argument("--out", required=True, help="report folder")
    nightly.add_argument("--baseline", type=int, default=10, help="runs of history (10)")
    nightly.add_argument("--no-bench", action="store_true", help="correctness only")
    tier_flag(nightly, default="nightly")  # the nightly job checks every gate case
    nightly.add_argument("--devices", default=None, metavar="all|0,1,...",
                         help="check and bench over these GPUs of this host (as theirs)")
    nightly.add_argument("--concurrent-timing", action="store_true",
                         help="with --devices: bench times on every device at once")
    verbose_flag(nightly)


def need_plotly(verb: str) -> None:
    """UsageError (exit 2) naming the extra when plotly is not installed."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise UsageError(f"kparity {verb} needs plotly: pip install 'kparity[history]'") from None


def cmd_report(args) -> int:
    """Writes the site (`results/report.py` lists the pages) and says where it is."""
    from results.report import write_report

    need_plotly("report")
    if args.baseline < 1:
        raise UsageError(f"--baseline {args.baseline}: needs at least 1 run of history")
    try:
        pages = write_report(open_store(args), args.out, baseline=args.baseline)
    except OSError as e:
        raise UsageError(f"cannot write the report to {args.out} ({e.strerror or e})") from None
    console.print(f"report: {len(pages)} pages in {Path(args.out)}/; open {pages[0]}",
                  soft_wrap=True)
    return 0


def _global_options(args) -> list[str]:
    """--store and --plugin of this invocation, for each step's argv. Plugins are passed on so
    that repro lines name them (`gpu_impls.load_plugin` runs each plugin once per process)."""
    head = ["--store", args.store] if args.store else []
    return head + [x for p in args.plugin or [] for x in ("--plugin", p)]


def _filter_options(args, skip: tuple[str, ...] = ()) -> list[str]:
    return [x for k in FILTERS if k not in skip for v in getattr(args, k) or []
            for x in (f"--{k}", v)]


def _accelerated_backends(args) -> tuple[list[str], list[str]]:
    """The selected impls' backends that run on an accelerator here, and why each other one
    does not."""
    fast, slow = [], []
    for name in sorted({i.backend for i in select_impls(args, need_available=False)}):
        be = backend_named(name)
        ok, why = be.available()
        if ok and be.accelerator:
            fast.append(name)
        else:
            slow.append(f"{name} ({'runs on cpu' if ok else why})")
    return fast, slow


def _new_run(store, before: set[str]) -> str | None:
    """The run a step just wrote (its `runs` row), or None when it wrote none."""
    return max(_run_ids(store) - before, default=None)


def _run_ids(store) -> set[str]:
    return set(store.read("runs").column("run_id").to_pylist())


def cmd_nightly(args) -> int:
    """check, then bench (only where a selected backend runs on an accelerator: a CPU-only
    machine would spend hours on model-sized cases), then `compare --baseline N` of each run
    this night wrote (the check run, the bench run) against its history, then the report. Each
    step is `kparity <verb>` run in-process with this invocation's store, plugins and filters
    (bench presets are bench case labels, e.g. `decode`, `hbm`: a gate preset such as
    `qwen3-8b` leaves the bench step with nothing to time, which it says and goes on).

    Exit 1 when the check failed (or the bench found a wrong kernel) or compare found a
    regression; 2 on bad input; 3 when nothing could be checked; else 0. A run with no earlier
    run of its device kind to compare with is "insufficient history", not a failure. The report
    is written whatever the outcome.

    Cron, every night at 03:17, from the checkout (cron runs /bin/sh, hence `.`):

        17 3 * * * cd /path/to/kparity && . .venv/bin/activate && kparity nightly --out /var/www/kparity >> .kparity/nightly.log 2>&1
    """
    from verbs.cli import main  # a composite verb: each step runs through the CLI, in-process

    need_plotly("nightly")  # its last step is the report: say so before an hour of checks
    if args.baseline < 2:
        raise UsageError(f"--baseline {args.baseline}: compare needs at least 2 runs of history")
    store = open_store(args)
    head, filters = _global_options(args), _filter_options(args)
    console.rule("nightly: check")
    before = _run_ids(store)
    spread = ["--devices", args.devices] if args.devices else []
    verbose = ["--verbose"] if args.verbose else []
    check_rc = main([*head, "check", *filters, "--tier", args.tier, *spread, *verbose])
    if check_rc in (2, 3, *STOPPED):  # bad input, no backend here for the selection, or
        return check_rc  # Ctrl-C / SIGTERM (its line said what was kept): nothing to go on
    failed = check_rc != 0
    tonight = {"check": _new_run(store, before)}

    console.rule("nightly: bench")
    fast, slow = _accelerated_backends(args)
    if args.no_bench:
        console.print("bench skipped: --no-bench")
    elif not fast:
        console.print("bench skipped: no selected backend runs on an accelerator here ("
                      + "; ".join(slow) + "); timing model-sized cases on a CPU takes hours")
    else:
        console.print(f"bench on {', '.join(fast)}" + (f" (not {'; '.join(slow)})" if slow else ""))
        before = _run_ids(store)
        bench_rc = main([*head, "bench", *_filter_options(args, skip=("backend",)),
                         "--backend", ",".join(fast), *spread, *verbose,
                         *(["--concurrent-timing"] if args.concurrent_timing else [])])
        tonight["bench"] = _new_run(store, before)
        if bench_rc in STOPPED:
            return bench_rc
        if bench_rc == 1:
            failed = True  # a wrong or crashing kernel at a bench size
        elif bench_rc:
            console.print(f"bench: nothing timed (exit {bench_rc}); going on")

    for verb, run_id in tonight.items():
        if run_id is None:
            continue
        console.rule(f"nightly: compare the {verb} run against its last {args.baseline} runs")
        rc = main([*head, "compare", run_id, "--baseline", str(args.baseline), *filters])
        if rc in STOPPED:
            return rc
        if rc == 1:
            failed = True
        elif rc == 2:  # the filters passed the check: the run has no earlier run to go by
            console.print(f"compare: insufficient history for the {verb} run {run_id}; "
                          f"not a failure")

    console.rule("nightly: report")
    report_rc = main([*head, "report", "--out", args.out, "--baseline", str(args.baseline)])
    if report_rc in STOPPED:
        return report_rc
    verdict = "[red]FAILED[/]" if failed else "[green]OK[/]"
    console.print(f"nightly {verdict}: check {'failed' if check_rc else 'passed'}; "
                  f"report in {args.out}/")
    return 1 if failed else report_rc


VERBS = {"report": cmd_report, "nightly": cmd_nightly}
