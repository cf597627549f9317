"""`kparity bench` and `kparity ab`: the timing verbs (protocol: `runners/timing.py`).

Both write a `runs` row, one `ceilings` row per backend (a >= 1 GiB copy and a large GEMM on a
GPU, measured in the same run), and `bench` rows (one per impl, case and mode; an A/B writes one
per run of each arm) and, for `ab`, one `ab` row per case with the verdict.
"""

from __future__ import annotations

from collections import Counter
from functools import partial

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from cases.generate import bench_cases, bench_plan
from cases.model import make_inputs
from results.runinfo import new_run_id, run_row
from results.store import RowWriter, Store
from runners.ab import ab_case
from runners.bench import bench_one, ceilings_row
from runners.cli import (UsageError, _backend, _impls, _split, check_presets, console,
                         select_impls, unknown)
from runners.stopping import StdRel


MIN_RUNS = 5


def _stop_rule(args):
    """A factory of fresh stopping rules with the CLI's settings."""
    return partial(StdRel, max_noise=args.max_noise, min_time_s=args.min_time,
                   min_samples=args.min_samples, timeout_s=args.timeout)


def _modes(args, backend) -> list[str]:
    modes = backend.timer().modes
    if args.mode in (None, "primary"):
        return [modes[0]]
    if args.mode == "all":
        return list(modes)
    return [args.mode] if args.mode in modes else []


def _start(args, verb: str, backends) -> tuple[Store, str, dict]:
    """Store, run id and per-backend ceilings (measured now, written at once)."""
    store = Store(args.store)
    store.ensure_writable()
    run_id = new_run_id()
    devices = {b: _backend(b).device() for b in backends}
    versions = {k: v for b in backends for k, v in _backend(b).versions().items()}
    filters = {k: getattr(args, k, None) for k in ("op", "impl", "backend", "dtype", "preset",
                                                   "mode")}
    store.write("runs", [run_row(run_id, verb, devices, versions, filters)], run_id, 0)
    ceilings, rows = {}, []
    with console.status("measuring ceilings (copy, GEMM)"):
        for b in backends:
            row = ceilings_row(run_id, b, _backend(b))
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


def _progress():
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[detail]}"), TimeElapsedColumn(), console=console,
                    transient=True)


def _fmt(value, spec: str, none: str = "-") -> str:
    return format(value, spec) if value is not None else none


def _case_text(row: dict) -> str:
    return row["label"].split(":", 1)[-1] or row["dims"]


def cmd_bench(args) -> int:
    impls = select_impls(args, need_available=True)
    presets = check_presets(args, bench_cases, extra=())
    work = bench_plan(impls, dtypes=_split(args.dtype) or None, presets=presets or None)
    items = [(w, mode) for w in sorted(work, key=lambda w: (w.case.id, w.impl.id))
             for mode in _modes(args, _backend(w.impl.backend))]
    if not items:
        console.print("[red]nothing to bench: no bench case of the selected impls matches the "
                      "filters (or the mode is not available on their timers)[/]")
        return 3
    store, run_id, ceilings = _start(args, "bench", sorted({w.impl.backend for w, _ in items}))
    stop = _stop_rule(args)
    rows, inputs = [], {}
    with RowWriter(store, "bench", run_id, every=20) as writer, _progress() as progress:
        task = progress.add_task("bench", total=len(items), detail="")
        for w, mode in items:
            label = w.case.label.split(":", 1)[-1]
            progress.update(task, description=f"{w.impl.id} {label} {w.case.dtype} {mode}")
            if w.case.id not in inputs:
                inputs = {w.case.id: make_inputs(w.case)}  # one case's inputs held at a time

            def tell(n, noise):
                progress.update(task, detail=f"{n} samples, noise {100 * noise:.2f}%")
            backend = _backend(w.impl.backend)
            row = bench_one(w.impl, backend, w.case, mode, stop, ceilings[w.impl.backend],
                            run_id, host_inputs=inputs[w.case.id], verify=not args.no_verify,
                            progress=tell)
            writer.add(row)
            rows.append(row)
            if row["status"] not in ("ok",):
                progress.console.print(f"[red]{row['status'].upper()}[/] {w.impl.id} case "
                                       f"{w.case.id} ({escape(w.case.short())}): "
                                       f"{escape(row['message'][:300])}", soft_wrap=True)
            progress.update(task, advance=1, detail="")
    bench_table(rows, run_id)
    counts = Counter(r["status"] for r in rows)
    console.print(f"{len(rows)} measurements: " + ", ".join(f"{v} {k}" for k, v in
                                                              sorted(counts.items()))
                  + f"; rows in {store.root}/")
    return 1 if counts["fail"] or counts["error"] else 0


def bench_table(rows: list[dict], run_id: str) -> None:
    """One line per measurement; % spec only where the device reports a spec peak."""
    spec = any(r.get("pct_peak_spec") is not None for r in rows)
    table = Table(title=f"bench {run_id}: median per call")
    cols = ["impl", "case", "dtype", "mode", "µs", "GB/s", "%copy"] + (["%spec"] if spec else [])
    for col in cols + ["noise", "n", "stop"]:
        table.add_column(col, justify="left" if col in ("impl", "case", "dtype", "mode", "stop")
                         else "right", no_wrap=True)
    for r in sorted(rows, key=lambda r: (r["op"], r["label"], r["dtype"], r["mode"], r["impl"])):
        ok = r["status"] == "ok"
        cells = [r["impl"], _case_text(r), r["dtype"], r["mode"],
                 f"{r['median_ns'] / 1e3:.2f}" if ok else f"[red]{r['status']}[/]",
                 _fmt(r.get("gbps"), ".0f") + ("[yellow]*[/]" if r.get("cache_resident") else ""),
                 _fmt(r.get("pct_copy_ceiling"), ".1f")]
        if spec:
            cells.append(_fmt(r.get("pct_peak_spec"), ".1f"))
        cells += [f"{100 * r['rel_std']:.2f}%" if ok and r.get("rel_std") is not None else "-",
                  str(r.get("n_samples") or "-"), r.get("stop_reason") or "-"]
        table.add_row(*cells)
    console.print(table)
    if any(r.get("cache_resident") for r in rows):
        console.print("[yellow]*[/] above 100% of peak: the data came from a cache (a benchmark "
                      "bug for an HBM-sized case)")


def _resolve(name: str):
    impls = _impls()
    if name in impls:
        return impls[name]
    matches = [i for i in impls.values() if i.name == name]
    if len(matches) == 1:
        return matches[0]
    raise unknown("impl", name, impls)


def cmd_ab(args) -> int:
    if args.runs < MIN_RUNS:
        raise UsageError(f"--runs {args.runs}: the verdict needs at least {MIN_RUNS} runs per arm "
                         f"(runs, not samples, are the unit of replication); pass --runs {MIN_RUNS}")
    a, b = _resolve(args.impl_a), _resolve(args.impl_b)
    if a.op != b.op:
        raise UsageError(f"{a.id} implements {a.op} and {b.id} implements {b.op}: an A/B needs "
                         f"two impls of one op")
    for impl in (a, b):
        ok, why = impl.available(_backend(impl.backend))
        if not ok:
            console.print(f"[red]{impl.id} cannot run here[/]: {escape(why)}")
            return 3
    ta, tb = _backend(a.backend).timer(), _backend(b.backend).timer()
    mode = args.mode if args.mode not in (None, "primary") else ta.modes[0]
    if mode not in ta.modes or mode not in tb.modes or ta.kind != tb.kind:
        raise UsageError(f"mode {mode!r}: {a.id} times with {ta.kind} {ta.modes}, {b.id} with "
                         f"{tb.kind} {tb.modes}; an A/B compares one mode on one kind of timer")
    args.impl = [a.id]
    presets = check_presets(args, bench_cases, extra=())
    cases = [w.case for w in bench_plan([a], dtypes=_split(args.dtype) or None,
                                        presets=presets or None) if b.contract.admits(w.case)]
    if not cases:
        console.print(f"[red]no bench case that both {a.id} and {b.id} admit matches the "
                      f"filters[/]")
        return 3
    store, run_id, ceilings = _start(args, "ab", sorted({a.backend, b.backend}))
    stop = _stop_rule(args)
    results = []
    with RowWriter(store, "bench", run_id, every=20) as bench_writer, \
            RowWriter(store, "ab", run_id, every=1) as ab_writer, _progress() as progress:
        task = progress.add_task("ab", total=len(cases) * 2 * args.runs, detail="")
        for case in cases:
            progress.update(task, description=f"{case.label.split(':', 1)[-1]} {case.dtype}")

            def landed(row):
                bench_writer.add(row)
                progress.update(task, advance=1)
            row = ab_case(a, _backend(a.backend), b, _backend(b.backend), case, mode, args.runs,
                          stop, ceilings[b.backend], run_id, on_row=landed)
            ab_writer.add(row)
            results.append(row)
            if row["status"] != "ok":
                progress.console.print(f"[red]{row['status'].upper()}[/] case {case.id} "
                                       f"({escape(case.short())}): {escape(row['message'][:300])}",
                                       soft_wrap=True)
    ab_table(results, a.id, b.id, mode, run_id)
    return _ab_exit(results, args.require)


def ab_table(rows: list[dict], a: str, b: str, mode: str, run_id: str) -> None:
    table = Table(title=f"ab {run_id}: B = {b} against A = {a}, {mode}, run medians")
    for col in ("case", "dtype", "A µs", "B µs", "B/A", "95% CI", "δ", "verdict", "A=B ulp"):
        table.add_column(col, justify="left" if col in ("case", "dtype", "verdict") else "right",
                         no_wrap=col == "case")
    colour = {"FASTER": "green", "SLOWER": "red", "SAME": "cyan", "AMBIGUOUS": "yellow"}
    for r in rows:
        if r["status"] != "ok":
            table.add_row(_case_text(r), r["dtype"], "-", "-", "-", "-", "-",
                          f"[red]{r['status']}[/]", "-")
            continue
        ma = sorted(r["runs_a_ns"])[len(r["runs_a_ns"]) // 2] / 1e3
        mb = sorted(r["runs_b_ns"])[len(r["runs_b_ns"]) // 2] / 1e3
        v = r["verdict"]
        table.add_row(_case_text(r), r["dtype"], f"{ma:.2f}", f"{mb:.2f}", f"{r['ratio']:.3f}",
                      f"[{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]", f"{100 * r['delta']:.1f}%",
                      f"[{colour[v]}]{v}[/]", str(r["ab_max_ulp"]))
    console.print(table)


def _ab_exit(rows: list[dict], require: str | None) -> int:
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


def add_parsers(sub, filters) -> None:
    def timing_flags(p):
        p.add_argument("--mode", default=None,
                       help="graph_rot, cold, eager (CUDA), wall (CPU), wall_eval (MLX); "
                            "'all', or the timer's primary (default)")
        p.add_argument("--max-noise", type=float, default=0.005,
                       help="stop once the relative stdev is under this (0.005)")
        p.add_argument("--min-time", type=float, default=0.5,
                       help="seconds of measured time before stopping (0.5)")
        p.add_argument("--min-samples", type=int, default=10)
        p.add_argument("--timeout", type=float, default=15.0,
                       help="seconds of wall time per measurement at most (15)")

    bench = sub.add_parser("bench", help="timing sweep over the bench cases")
    filters(bench)
    timing_flags(bench)
    bench.add_argument("--no-verify", action="store_true",
                       help="skip the oracle check before timing")
    ab = sub.add_parser("ab", help="A/B of two impls: correctness, interleaved runs, verdict")
    ab.add_argument("impl_a")
    ab.add_argument("impl_b")
    for flag, help_text in (("--dtype", "f32, f16, bf16"),
                            ("--preset", "bench case label substring, e.g. hbm, decode")):
        ab.add_argument(flag, action="append", help=help_text)
    timing_flags(ab)
    ab.add_argument("--runs", type=int, default=5, help="interleaved runs per arm (>= 5)")
    ab.add_argument("--require", choices=("faster", "not-slower", "same"),
                    help="exit 1 unless every case's verdict (B against A) is this")
