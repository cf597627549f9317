"""`kparity bench` and `kparity ab`: the timing verbs (protocol: `runners/timing.py`).

Both write a `runs` row, one `ceilings` row per backend (a >= 1 GiB copy and a large GEMM on a
GPU, measured in the same run), and `bench` rows (one per impl, case and mode; an A/B writes one
per run of each arm) and, for `ab`, one `ab` row per case with the verdict.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from functools import partial

from rich.markup import escape
from rich.table import Table

from cases.generate import (admitted_variant, bench_cases, bench_plan, bench_presets, convention,
                            selected)
from cases.model import make_inputs
from gpu_impls.contract import ContractError
from oracle.spec import get_op
from results.runinfo import new_run_id, run_row
from results.store import RowWriter, Store
from runners.ab import ab_group
from runners.bench import bench_one, ceilings_row, timed_mode
from runners.stopping import StdRel, shortfall
from runners.timing import MODES
from verbs import outputs
from verbs.stops import interruptible, keeping_rows_on_stop
from verbs.console import SweepProgress, console, duration
from verbs.selection import (add_filter_args, backend_named, check_presets, devices_flag,
                             open_store, pick_devices, registered_impls, say_left_out,
                             select_impls, verbose_flag)
from verbs.usage import UsageError, split_csv, unknown

ORDER = 2  # after check and repro in `kparity --help`
GROUP = "timing"  # its heading in `kparity --help`

MIN_RUNS = 5
# Bench with nothing narrowing it on a CPU: these presets (`--preset all`: every bench case).
CPU_DEFAULT_PRESET = "decode"


def check_timing_flags(args) -> None:
    """Every numeric timing flag in its range, or a UsageError naming the flag and the range:
    `--max-noise -1 --timeout 0` used to give one-sample rows reported `noise 0.00 %, ok`."""
    def need(flag: str, value, ok: bool, valid: str) -> None:
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            raise UsageError(f"{flag} {value}: {valid}")
    need("--max-noise", args.max_noise, 0 < args.max_noise <= 1,
         "a relative stdev in (0, 1], e.g. 0.005 for 0.5 %")
    need("--min-time", args.min_time, args.min_time >= 0,
         "seconds of measured time, at least 0")
    need("--min-samples", args.min_samples, args.min_samples >= 2,
         "at least 2 (the noise needs two samples)")
    need("--timeout", args.timeout, args.timeout > 0, "seconds per measurement, above 0")
    if args.min_time >= args.timeout:  # measured time never exceeds wall time
        raise UsageError(f"--min-time {args.min_time} is not below --timeout {args.timeout}: "
                         "each measurement would time out before its noise is judged\n  lower "
                         "--min-time or raise --timeout")
    runs = getattr(args, "runs", None)
    if runs is not None and runs < MIN_RUNS:
        raise UsageError(f"--runs {runs}: the verdict needs at least {MIN_RUNS} runs per arm "
                         f"(runs, not samples, are the unit of replication)\n  pass --runs "
                         f"{MIN_RUNS} or more")


def _stop_rule(args):
    """A factory of fresh stopping rules with the CLI's settings."""
    return partial(StdRel, max_noise=args.max_noise, min_time_s=args.min_time,
                   min_samples=args.min_samples, timeout_s=args.timeout)


def check_mode(mode: str | None, impls) -> None:
    """--mode: a mode some timer knows (else the closest-first list) and that at least one
    selected impl's timer offers."""
    if mode in (None, "primary", "all"):
        return
    if mode not in MODES:
        raise unknown("mode", mode, (*MODES, "all", "primary"))
    timers = {backend_named(i.backend).timer() for i in impls}
    if timers and not any(mode in t.modes for t in timers):
        offered = "; ".join(f"{t.kind}: {', '.join(t.modes)}" for t in
                            sorted(timers, key=lambda t: t.kind))
        raise UsageError(f"--mode {mode}: not offered by the timers of the selected impls "
                         f"({offered})\n  choose one of those, 'all' or 'primary'")


def _modes(args, backend) -> list[str]:
    modes = backend.timer().modes
    if args.mode in (None, "primary"):
        return [modes[0]]
    if args.mode == "all":
        return list(modes)
    return [args.mode] if args.mode in modes else []


def _timed_items(items: list) -> tuple[list, dict[str, str]]:
    """(the (work, mode) items with `chain` turned into `graph_rot` where the op declares no
    chain input, duplicates dropped; op -> why, for each op that was)."""
    out, seen, why = [], set(), {}
    for w, mode in items:
        timed, reason = timed_mode(mode, w.case.spec)
        if reason:
            why[w.case.op] = reason
        if (id(w), timed) not in seen:
            seen.add((id(w), timed))
            out.append((w, timed))
    return out, why


def _start(args, verb: str, backends) -> tuple[Store, str, dict]:
    """Store, run id and per-backend ceilings (measured now, written at once)."""
    store = open_store(args)
    store.ensure_writable()
    run_id = new_run_id()
    devices = {b: backend_named(b).device() for b in backends}
    versions = {k: v for b in backends for k, v in backend_named(b).versions().items()}
    # the stopping rule's settings too: whether a row met the noise target is judged by them
    filters = {k: getattr(args, k, None) for k in ("op", "impl", "backend", "dtype", "preset",
                                                   "mode", "max_noise", "min_time",
                                                   "min_samples", "timeout")}
    store.write("runs", [run_row(run_id, verb, devices, versions, filters)], run_id, 0)
    ceilings, rows = {}, []
    with console.status("measuring ceilings (copy, GEMM)"):
        for b in backends:
            row = ceilings_row(run_id, b, backend_named(b))
            ceilings[b] = row
            rows.append(row)
    store.write("ceilings", rows, run_id, 0)
    for r in rows:
        gemm = f", {r['gemm']} {r['gemm_tflops']:.0f} TFLOP/s" if r["gemm_tflops"] else ""
        spec = (f", spec peak {r['peak_bw_spec_gbps']:.0f} GB/s" if r["peak_bw_spec_gbps"]
                else "")
        console.print(f"ceilings {r['backend']} ({escape(r['device'])}): copy "
                      f"{r['copy_gbps']:.0f} GB/s{spec}{gemm}")
    return store, run_id, ceilings


def _fmt(value, spec: str, none: str = "-") -> str:
    return format(value, spec) if value is not None else none


def _case_text(row: dict) -> str:
    return row["label"].split(":", 1)[-1] or row["dims"]


def note(row: dict, max_noise: float) -> str:
    """An ok row's shortfall of the noise target (`runners.stopping.shortfall`), else ""."""
    if row["status"] != "ok":
        return ""
    return shortfall(row.get("stop_reason") or "", row.get("rel_std"),
                     row.get("n_samples") or 0, max_noise)


def _presets(args, impls) -> tuple[list[str] | None, bool]:
    """(the preset filter, whether it is the CPU default). With no --preset, --op or --impl and
    only CPU backends, the decode presets: every bench case on a CPU takes hours."""
    presets = check_presets(args, bench_cases, extra=("all",))
    if "all" in presets:
        return None, False
    if presets:
        return presets, False
    on_cpu = bool(impls) and all(backend_named(i.backend).device() == "cpu" for i in impls)
    if on_cpu and not split_csv(args.op) and not split_csv(args.impl):
        return [CPU_DEFAULT_PRESET], True
    return None, False


def why_no_cases(impl, cases, dtypes, presets, kind: str) -> str:
    """Why `impl` gets none of `cases` (its op's `kind` cases: "bench", where a case may run
    under another rounding convention, or "gate", where it may not): the op has none, the
    filters leave none, or its contract refuses every one (the invariant that does, and what its
    fix says would match); "" if it admits some."""
    if not cases:
        return f"{impl.id}: its op {impl.op} has no {kind} cases"
    picked = [c for c in cases if selected(c, dtypes, presets)]
    if not picked:
        given = " ".join([*(f"--preset {p}" for p in presets or []),
                          *(f"--dtype {d}" for d in dtypes or [])])
        names = sorted({c.label.split(":", 1)[-1] for c in cases})
        shown = ", ".join(names[:20]) + (f" ... and {len(names) - 20} more"
                                          if len(names) > 20 else "")
        return (f"{impl.id}: none of the {len(cases)} {kind} cases of {impl.op} matches "
                f"{given}; its presets: {shown}")
    admits = ((lambda c: admitted_variant(impl, c) is not None) if kind == "bench"
              else impl.contract.admits)
    if any(admits(c) for c in picked):
        return ""
    refusals, example = Counter(), {}
    for c in picked:
        try:
            impl.contract.check(impl.id, c)
        except ContractError as e:
            refusals[e.invariant] += 1
            example.setdefault(e.invariant, e)
    (top, _), *_ = refusals.most_common()
    which = f"the {kind} case" if len(picked) == 1 else f"all {len(picked)} {kind} cases"
    parts = "; ".join(f"`{inv}` refuses {n} ({example[inv].values}: {example[inv].why})"
                      for inv, n in refusals.most_common())
    if len(refusals) == 1:
        parts = f"`{top}` ({example[top].values}: {example[top].why})"
    return (f"{impl.id}: its contract refuses {which} of {impl.op}: {parts}. "
            f"What would match: {example[top].fix}")


def say_how_long(verb: str, measurements: int, args) -> None:
    """Up front, where the run may take minutes: each measurement lasts --min-time at least and
    --timeout at most (its noise judged in between: a CPU's noise often keeps it going)."""
    low, high = measurements * args.min_time, measurements * args.timeout
    if high >= 60:
        console.print(f"{verb}: {measurements} measurements of {args.min_time:g}-{args.timeout:g} s"
                      f" each: {duration(low)} to {duration(high)}; fewer with --runs, --preset, "
                      "--dtype or a lower --timeout")


def why_not_benched(impl, dtypes, presets, mode=None) -> str:
    """Why `impl` has no bench work: `why_no_cases` over its op's bench cases, else its timer
    has no such mode."""
    why = why_no_cases(impl, bench_cases(impl.op), dtypes, presets, "bench")
    if why:
        return why
    timer = backend_named(impl.backend).timer()
    return (f"{impl.id}: its timer ({timer.kind}) has no mode {mode!r}; its modes: "
            f"{', '.join(timer.modes)}")


@interruptible
def cmd_bench(args) -> int:
    check_timing_flags(args)
    if args.concurrent_timing and not args.devices:
        raise UsageError("--concurrent-timing: only with --devices (one device times alone)")
    impls = select_impls(args, need_available=True)
    check_mode(args.mode, impls)
    presets, default = _presets(args, impls)
    dtypes = split_csv(args.dtype) or None
    work = bench_plan(impls, dtypes=dtypes, presets=presets)
    ordered = sorted(work, key=lambda w: ((w.base or w.case).id, w.impl.id))
    items, fallbacks = _timed_items([(w, mode) for w in ordered
                                     for mode in _modes(args, backend_named(w.impl.backend))])
    idle = [i for i in impls if not any(w.impl is i for w, _ in items)]
    if not impls:
        console.print("[red]nothing to bench: no impl matches the --op, --impl and --backend "
                      "filters together[/] (`kparity ops` lists the impls)")
        return 3
    if not items:
        console.print("[red]nothing to bench:[/]")
        for impl in idle:
            console.print("  " + escape(why_not_benched(impl, dtypes, presets, args.mode)),
                          soft_wrap=True)
        return 3
    say_left_out("not benched", {impl.id: why_not_benched(impl, dtypes, presets, args.mode)
                                 for impl in idle}, args.verbose)  # left out: say why, always
    if default:
        every = len(bench_plan(impls, dtypes=dtypes))
        console.print(f"no --preset, --op or --impl on a CPU: benching the {CPU_DEFAULT_PRESET} "
                      f"presets ({len(items)} measurements); --preset all for every bench case "
                      f"({every})")
    console.print(f"benching {len(items)} (impl, case, mode) measurements, each up to "
                  f"--timeout {args.timeout:g} s")
    for reason in fallbacks.values():
        console.print(f"[yellow]note:[/] {escape(reason)}", soft_wrap=True)
    pick_devices(args, {w.impl.backend for w, _ in items})
    store, run_id, ceilings = _start(args, "bench", sorted({w.impl.backend for w, _ in items}))
    stop = _stop_rule(args)
    rows, inputs = [], {}
    with keeping_rows_on_stop(args, "bench", run_id, store, "bench"), \
            RowWriter(store, "bench", run_id, every=20) as writer, \
            SweepProgress("bench", "detail") as progress:
        say_how_long("bench", len(items), args)
        task = progress.add_task("bench", total=len(items), detail="")

        def landed(w, row):
            writer.add(row)
            rows.append(row)
            if row["status"] not in ("ok",):
                progress.console.print(f"[red]{row['status'].upper()}[/] {w.impl.id} case "
                                       f"{w.case.id} ({escape(w.case.short())}): "
                                       f"{escape(row['message'][:300])}", soft_wrap=True)
            progress.update(task, advance=1, detail="")
        if args.devices:
            for (w, _), row in _dealt(args, items, ceilings, run_id, progress.console.print):
                landed(w, row)
        else:
            for w, mode in items:
                label = w.case.label.split(":", 1)[-1]
                progress.update(task, description=f"{w.impl.id} {label} {w.case.dtype} {mode}")
                drawn = w.base or w.case  # a convention variant runs on its bench case's inputs
                if drawn.id not in inputs:
                    inputs = {drawn.id: make_inputs(drawn)}  # one case's inputs held at a time

                def tell(n, noise):
                    progress.update(task, detail=f"{n} samples, noise {100 * noise:.2f}%")
                backend = backend_named(w.impl.backend)
                row = bench_one(w.impl, backend, w.case, mode, stop, ceilings[w.impl.backend],
                                run_id, host_inputs=inputs[drawn.id], verify=not args.no_verify,
                                progress=tell, copy_same=args.copy_same_bytes)
                landed(w, row)
    notes = {i: note(r, args.max_noise) for i, r in enumerate(rows)}
    bench_table(rows, run_id, notes)
    counts = Counter(r["status"] for r in rows)
    console.print(f"{len(rows)} measurements: " + ", ".join(f"{v} {k}" for k, v in
                                                              sorted(counts.items()))
                  + convergence_summary(notes.values(), args) + f"; rows in {store.root}/")
    outputs.write_bench(args, rows, run_id, notes)
    return 1 if counts["fail"] or counts["error"] else 0


def _dealt(args, items, ceilings, run_id, say):
    """`bench --devices`: the (item, row) pairs as the devices' workers measure them
    (`runners.devices.bench_rows`: verified in parallel, timed one device at a time unless
    --concurrent-timing). A worker may wait for the others' measurements: its limit counts
    them."""
    from runners.devices import bench_rows
    from runners.limits import BASE_S, case_timeout

    per_measure = args.timeout * (2 if args.copy_same_bytes else 1) + BASE_S
    waits = 1 if args.concurrent_timing else len(args.devices)

    def one(item, bench):
        w, _ = item
        settings = {"new_stop": _stop_rule(args), "ceilings": ceilings[w.impl.backend],
                    "verify": not args.no_verify, "copy_same": args.copy_same_bytes}
        return bench(item, run_id, settings,
                     case_timeout(w.case, first_of_shape=True) + waits * per_measure)
    with bench_rows(args, items, say) as rows:
        yield from rows(items, one)


def convergence_summary(notes, args) -> str:
    """'; 3 not converged (...)' for the summary line: the rows that stopped short of the
    noise target, by how; "" when every ok row converged."""
    kinds = Counter(n.split(" (", 1)[0] for n in notes if n)
    if not kinds:
        return ""
    parts = []
    if kinds["not converged"]:
        parts.append(f"{kinds['not converged']} not converged (stopped at --timeout "
                     f"{args.timeout:g} s before reaching --max-noise "
                     f"{100 * args.max_noise:.3g} %)")
    if kinds["noise plateau"]:
        parts.append(f"{kinds['noise plateau']} at a noise plateau above --max-noise")
    return "; [yellow]" + "; ".join(parts) + "[/]"


def row_convention(row: dict) -> str:
    """A bench row's rounding convention (`cases.generate.convention`), "" for ops without."""
    names = get_op(row["op"]).conventions
    params = json.loads(row.get("params") or "{}")
    return ",".join(f"{n}={params[n]}" for n in names if n in params)


def bench_table(rows: list[dict], run_id: str, notes: dict[int, str]) -> None:
    """One line per measurement; % spec only where the device reports a spec peak; the status
    says when an ok row stopped short of the noise target (`notes`)."""
    spec = any(r.get("pct_peak_spec") is not None for r in rows)
    same = any(r.get("pct_copy_same") is not None for r in rows)
    conv = any(row_convention(r) for r in rows)
    table = Table(title=f"bench {run_id}: median per call")
    cols = (["impl", "case", "dtype"] + (["convention"] if conv else [])
            + ["mode", "µs", "GB/s", "%copy"] + (["%spec"] if spec else [])
            + (["%cp-same"] if same else []))
    for col in cols + ["noise", "n", "stop", "status"]:
        table.add_column(col, justify="left" if col in ("impl", "case", "dtype", "convention",
                                                        "mode", "stop", "status") else "right",
                         no_wrap=col != "status")
    order = sorted(range(len(rows)), key=lambda i: (rows[i]["op"], rows[i]["label"],
                                                    rows[i]["dtype"], rows[i]["mode"],
                                                    rows[i]["impl"]))
    for i in order:
        r = rows[i]
        ok = r["status"] == "ok"
        cells = [r["impl"], _case_text(r), r["dtype"], *([row_convention(r)] if conv else []),
                 r["mode"],
                 f"{r['median_ns'] / 1e3:.2f}" if ok else "-",
                 _fmt(r.get("gbps"), ".0f") + ("[yellow]*[/]" if r.get("cache_resident") else ""),
                 _fmt(r.get("pct_copy_ceiling"), ".1f")]
        if spec:
            cells.append(_fmt(r.get("pct_peak_spec"), ".1f"))
        if same:
            cells.append(_fmt(r.get("pct_copy_same"), ".1f"))
        status = (f"[yellow]ok, {escape(notes[i])}[/]" if notes.get(i) else "ok") if ok else \
            f"[red]{r['status']}[/]"
        cells += [f"{100 * r['rel_std']:.2f}%" if ok and r.get("rel_std") is not None else "-",
                  str(r.get("n_samples") or "-"), r.get("stop_reason") or "-", status]
        table.add_row(*cells)
    console.print(table)
    if same:
        console.print("%cp-same: the time of a copy of the row's bytes in the same mode and "
                      "rotation, as % of the row's time (--copy-same-bytes)")
    if any(r.get("cache_resident") for r in rows):
        console.print("[yellow]*[/] above 100% of peak: the data came from a cache (a benchmark "
                      "bug for an HBM-sized case)")


def _natural(text: str) -> list:
    """Sort key: decode-1x4096 before decode-16x4096."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def print_bench_presets(impls, dtypes=None) -> None:
    """`kparity cases`' bench section: the bench presets (`bench --preset NAME`), one line per
    group of ops they apply to, with the (impl, case) pairs of the selected impls they time."""
    by_ops = {}
    for name, work in bench_presets(impls, dtypes).items():
        ops = ", ".join(sorted({w.impl.op for w in work}))
        names, pairs = by_ops.get(ops, ([], 0))
        by_ops[ops] = (names + [name], pairs + len(work))
    if not by_ops:
        return
    n = sum(len(names) for names, _ in by_ops.values())
    table = Table(title=f"bench presets ({n}): kparity bench --preset NAME")
    for col in ("ops", "presets", "(impl, case) pairs"):
        table.add_column(col, justify="right" if col.startswith("(") else "left")
    for ops, (names, pairs) in sorted(by_ops.items()):
        table.add_row(ops, ", ".join(sorted(names, key=_natural)), str(pairs))
    console.print(table)
    console.print(f"bench with no --preset, --op or --impl on a CPU times the "
                  f"{CPU_DEFAULT_PRESET} presets; --preset all: every bench case")


def _resolve(name: str):
    impls = registered_impls()
    if name in impls:
        return impls[name]
    matches = [i for i in impls.values() if i.name == name]
    if len(matches) == 1:
        return matches[0]
    raise unknown("impl", name, impls)


def _letters(n: int) -> list[str]:
    """The arms' letters: A (the baseline), B, C, ..., then A2, B2, ... past Z."""
    return [chr(ord("A") + i % 26) + (str(i // 26 + 1) if i >= 26 else "") for i in range(n)]


def _ab_impls(args) -> list:
    """The impls of `ab A B [C ...]`: one op, runnable here (else exit 3)."""
    if len(args.impls) < 2:
        raise UsageError(f"ab {' '.join(args.impls)}: give a baseline and at least one impl to "
                         "compare with it (kparity ab A B [C ...])")
    impls = [_resolve(name) for name in args.impls]
    a = impls[0]
    for x in impls[1:]:
        if x.op != a.op:
            raise UsageError(f"{a.id} implements {a.op} and {x.id} implements {x.op}: an A/B "
                             f"needs two impls of one op")
    for impl in impls:
        ok, why = impl.available(backend_named(impl.backend))
        if not ok:
            console.print(f"[red]{impl.id} cannot run here[/]: {escape(why)}")
            raise SystemExit(3)
    return impls


def _ab_mode(args, impls) -> str:
    """The one mode every arm is timed in, on one kind of timer."""
    check_mode(args.mode, impls)
    timers = [backend_named(i.backend).timer() for i in impls]
    mode = args.mode if args.mode not in (None, "primary") else timers[0].modes[0]
    if mode == "all" or any(mode not in t.modes or t.kind != timers[0].kind for t in timers):
        shown = ", ".join(f"{i.id} times with {t.kind} {t.modes}" for i, t in zip(impls, timers))
        raise UsageError(f"mode {mode!r}: {shown}\n  an A/B compares one mode on one kind of "
                         "timer: choose impls of one backend (`kparity ops` lists them)")
    mode, reason = timed_mode(mode, get_op(impls[0].op))
    if reason:
        console.print(f"[yellow]note:[/] {escape(reason)}", soft_wrap=True)
    return mode


@interruptible
def cmd_ab(args) -> int:
    check_timing_flags(args)
    impls = _ab_impls(args)
    mode = _ab_mode(args, impls)
    a, others = impls[0], impls[1:]
    letters = _letters(len(impls))
    args.impl = [i.id for i in impls]  # the runs row's filters
    presets = [p for p in check_presets(args, bench_cases, extra=("all",)) if p != "all"]
    dtypes = split_csv(args.dtype) or None
    # (case, arms): the baseline and the other impls, each on the bench case under a rounding
    # convention it admits (`admitted_variant`: the same shapes and inputs)
    groups = []
    for c in bench_cases(a.op):
        if not selected(c, dtypes, presets):
            continue
        arms = [(letters[k], x, backend_named(x.backend), admitted_variant(x, c))
                for k, x in enumerate(impls)]
        if arms[0][3] is not None and sum(v is not None for *_, v in arms) > 1:
            groups.append((arms[0][3], [arm for arm in arms if arm[3] is not None]))
    mixed = {}  # impl -> the conventions it runs under
    for _, arms in groups:
        for _, impl, _, v in arms:
            if convention(v):
                mixed.setdefault(impl.id, set()).add(convention(v))
    if len(set().union(*mixed.values()) if mixed else ()) > 1:  # say which each arm runs
        console.print("conventions: " + "; ".join(f"{i} {' / '.join(sorted(c))}"
                                                  for i, c in mixed.items())
                      + " (each arm on the same shapes and inputs under its own)")
    if not groups:
        console.print(f"[red]no bench case that {a.id} and {' or '.join(x.id for x in others)} "
                      "admit matches the filters:[/]")
        for impl in impls:
            if not bench_plan([impl], dtypes=dtypes, presets=presets or None):
                console.print("  " + escape(why_not_benched(impl, dtypes, presets or None, mode)),
                              soft_wrap=True)
        return 3
    store, run_id, ceilings = _start(args, "ab", sorted({i.backend for i in impls}))
    stop = _stop_rule(args)
    results, runs = [], []
    with keeping_rows_on_stop(args, "ab", run_id, store, "bench"), \
            RowWriter(store, "bench", run_id, every=20) as bench_writer, \
            RowWriter(store, "ab", run_id, every=1) as ab_writer, \
            SweepProgress("ab", "detail") as progress:
        total = sum(len(arms) for _, arms in groups) * args.runs
        say_how_long("ab", total, args)
        task = progress.add_task("ab", total=total, detail="")
        for case, arms in groups:
            progress.update(task, description=f"{case.label.split(':', 1)[-1]} {case.dtype}")

            def landed(row):
                bench_writer.add(row)
                runs.append(row)
                progress.update(task, advance=1)
            rows = ab_group(arms, case, mode, args.runs, stop, ceilings, run_id, on_row=landed,
                            verify=not args.no_verify)
            for row in rows:
                ab_writer.add(row)
                results.append(row)
                if row["status"] != "ok":
                    progress.console.print(
                        f"[red]{row['status'].upper()}[/] {row['impl_b']} against {a.id}, case "
                        f"{case.id} ({escape(case.short())}): {escape(row['message'][:300])}",
                        soft_wrap=True)
    if len(impls) == 2:
        ab_table(results, a.id, others[0].id, mode, run_id)
    else:
        ab_table_n(results, [i.id for i in impls], mode, run_id)
    short = convergence_summary([note(r, args.max_noise) for r in runs], args)
    if short:  # a run's median still counts: the verdict's delta follows the run-to-run noise
        console.print(f"of {len(runs)} runs: {short[2:]}")
    return ab_exit_code(results, args.require)


def _median_us(values) -> float:
    return sorted(values)[len(values) // 2] / 1e3


def ab_table(rows: list[dict], a: str, b: str, mode: str, run_id: str) -> None:
    table = Table(title=f"ab {run_id}: B = {b} against A = {a}, {mode}, run medians")
    conv = any(r.get("convention_a") or r.get("convention_b") for r in rows)
    text = ("case", "dtype", "A convention", "B convention", "verdict")
    for col in ("case", "dtype", *(("A convention", "B convention") if conv else ()), "A µs",
                "B µs", "B/A", "95% CI", "δ", "verdict", "A=B ulp"):
        table.add_column(col, justify="left" if col in text else "right", no_wrap=col == "case")
    for r in rows:
        head = [_case_text(r), r["dtype"],
                *((r.get("convention_a") or "-", r.get("convention_b") or "-") if conv else ())]
        if r["status"] != "ok":
            table.add_row(*head, "-", "-", "-", "-", "-", f"[red]{r['status']}[/]", "-")
            continue
        v = r["verdict"]
        table.add_row(*head, f"{_median_us(r['runs_a_ns']):.2f}",
                      f"{_median_us(r['runs_b_ns']):.2f}", f"{r['ratio']:.3f}",
                      f"[{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]", f"{100 * r['delta']:.1f}%",
                      f"[{COLOUR[v]}]{v}[/]", str(r["ab_max_ulp"]))
    console.print(table)


COLOUR = {"FASTER": "green", "SLOWER": "red", "SAME": "cyan", "AMBIGUOUS": "yellow"}


def ab_table_n(rows: list[dict], ids: list[str], mode: str, run_id: str) -> None:
    """`ab A B C ...`, tritonbench style: one line per case, the baseline's time, then for each
    other impl its time, its ratio to the baseline with the 95 % interval, and the verdict."""
    letters = _letters(len(ids))
    console.print(f"ab {run_id}, {mode}, run medians: "
                  + ", ".join(f"{k} = {i}" for k, i in zip(letters, ids)) + " (A: the baseline)")
    table = Table(title=f"ab {run_id}: each impl against A = {ids[0]}")
    cols = ["case", "dtype", "A µs"]
    for k in letters[1:]:
        cols += [f"{k} µs", f"{k}/A [95% CI]", f"{k} verdict"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("case", "dtype")
                         or col.endswith("verdict") else "right", no_wrap=True)
    by_case = {}
    for r in rows:
        by_case.setdefault((r["case_id"], r["mode"]), []).append(r)
    for group in by_case.values():
        first = group[0]
        base = next((r for r in group if r["status"] == "ok"), None)
        cells = [_case_text(first), first["dtype"],
                 f"{_median_us(base['runs_a_ns']):.2f}" if base else "-"]
        mine = {r["impl_b"]: r for r in group}
        for impl in ids[1:]:
            r = mine.get(impl)
            if r is None:
                cells += ["-", "-", "refused"]  # its contract does not admit the case
            elif r["status"] != "ok":
                cells += ["-", "-", f"[red]{r['status']}[/]"]
            else:
                v = r["verdict"]
                cells += [f"{_median_us(r['runs_b_ns']):.2f}",
                          f"{r['ratio']:.3f} [{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]",
                          f"[{COLOUR[v]}]{v}[/]"]
        table.add_row(*cells)
    console.print(table)


def ab_exit_code(rows: list[dict], require: str | None) -> int:
    if any(r["status"] != "ok" for r in rows):
        return 1
    allowed = {"faster": {"FASTER"}, "not-slower": {"FASTER", "SAME"},
               "same": {"SAME"}}.get(require or "", None)
    if allowed is not None:
        missed = [r for r in rows if r["verdict"] not in allowed]
        if missed:
            console.print(f"[red]--require {require}: {len(missed)} of {len(rows)} cases "
                          f"answered otherwise[/]")
            return 1
    return 0


def add_parsers(sub) -> None:
    def timing_flags(p):
        p.add_argument("--mode", default=None,
                       help="chain (CUDA, primary: each call after an ordinary kernel that "
                            "rewrites its input, that kernel's own time subtracted), graph_rot "
                            "(CUDA: back-to-back calls of the impl itself, where a PDL kernel "
                            "overlaps its own previous call), cold, eager (CUDA), wall (CPU), "
                            "wall_eval (MLX), metal_ts (Metal); 'all', or the timer's primary "
                            "(default)")
        p.add_argument("--max-noise", type=float, default=0.005, metavar="FRACTION",
                       help="stop once the relative stdev is under this, in (0, 1] (0.005: "
                            "0.5 %%); a row that stops otherwise is marked not converged")
        p.add_argument("--min-time", type=float, default=0.5, metavar="SECONDS",
                       help="seconds of measured time before stopping, >= 0 and below "
                            "--timeout (0.5)")
        p.add_argument("--min-samples", type=int, default=10, metavar="N",
                       help="samples before stopping, >= 2 (10)")
        p.add_argument("--timeout", type=float, default=15.0, metavar="SECONDS",
                       help="seconds of wall time per measurement at most, > 0 (15)")

    bench = sub.add_parser("bench", help="timing sweep over the bench cases",
                           description="Timing sweep over the bench cases (`kparity cases` "
                                       "lists the bench presets). With no --preset, --op or "
                                       "--impl on a CPU: the decode presets (--preset all: "
                                       "every bench case).")
    add_filter_args(bench)
    timing_flags(bench)
    bench.add_argument("--no-verify", action="store_true",
                       help="skip the oracle check before timing")
    bench.add_argument("--copy-same-bytes", action="store_true",
                       help="also time a copy of each case's bytes in the same mode and "
                            "rotation (CUDA timers): the %%cp-same column, the ceiling of a "
                            "kernel that small (a 1 GiB copy's %%copy is out of its reach)")
    devices_flag(bench)
    verbose_flag(bench)
    bench.add_argument("--concurrent-timing", action="store_true",
                       help="with --devices: time on every device at once (default: one "
                            "device at a time, since GPUs of one host share power and PCIe)")
    outputs.add_flags(bench, "(impl, case, mode) measurement")
    ab = sub.add_parser("ab", help="A/B of a baseline and one or more impls: correctness, "
                                   "interleaved runs, verdicts")
    ab.add_argument("impls", nargs="+", metavar="IMPL",
                    help="the baseline A first, then the impls compared with it (B, C, ...)")
    for flag, help_text in (("--dtype", "f32, f16, bf16"),
                            ("--preset", "bench case label substring, e.g. hbm, decode")):
        ab.add_argument(flag, action="append", help=help_text)
    timing_flags(ab)
    ab.add_argument("--runs", type=int, default=5, help="interleaved runs per arm (>= 5)")
    ab.add_argument("--no-verify", action="store_true",
                    help="skip each arm's oracle check (correct: unverified), for cases whose "
                         "float64 oracle takes minutes; A against the others still runs")
    ab.add_argument("--require", choices=("faster", "not-slower", "same"),
                    help="exit 1 unless every impl's verdict against A on every case is this")


VERBS = {"bench": cmd_bench, "ab": cmd_ab}
