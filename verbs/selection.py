"""What every verb selects with: the impl and case filters (--op/--impl/--backend/--dtype/
--preset, --seed, --tier, --devices, a --cases file), the work list they give, and the printed
repro line that runs one of its cases again.

It imports only the layers below the verbs (oracle, cases, gpu_impls, runners, results) and the
verbs' console and usage modules, never a verb module.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict

from rich.markup import escape

from cases.casefile import closest
from cases.generate import Work, bench_cases, gate_cases, plan, sampled
from cases.model import Case
from cases.tiers import DEFAULT_TIER, TIERS
from oracle.dtypes import FLOAT_DTYPES
from oracle.spec import registry as op_registry
from verbs.console import console
from verbs.usage import UsageError, split_csv, unknown


def registered_impls():
    import gpu_impls

    return gpu_impls.impls()


def backend_named(name):
    import gpu_impls

    return gpu_impls.backend(name)


def op_and_backend_filters(args) -> tuple[list[str], list[str]]:
    """The --op and --backend values, each checked (an unknown one is bad input naming the
    valid ones)."""
    import gpu_impls

    gpu_impls.impls()  # loads the plugins (entry points): the ops they register are valid too
    ops = split_csv(args.op)
    for op in ops:
        if op not in op_registry():
            raise unknown("op", op, op_registry())
    backends = split_csv(args.backend)
    for b in backends:
        if b not in gpu_impls.BACKENDS:
            raise unknown("backend", b, gpu_impls.BACKENDS)
    return ops, backends


def select_impls(args, need_available: bool) -> list:
    """Impls matching --op/--impl/--backend; with need_available, only those runnable here
    (the others said in one line, `say_skipped`)."""
    all_impls = registered_impls()
    ops, backends = op_and_backend_filters(args)
    wanted = split_csv(args.impl)
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
    for d in split_csv(args.dtype):
        if d not in FLOAT_DTYPES:
            raise unknown("dtype", d, FLOAT_DTYPES)

    chosen = [i for i in all_impls.values()
              if (not ops or i.op in ops) and (not backends or i.backend in backends)
              and (not ids or i.id in ids)]
    if not need_available:
        return sorted(chosen, key=lambda i: i.id)
    runnable, skipped = [], []
    for impl in chosen:
        backend_ok = backend_named(impl.backend).available()[0]
        ok, why = impl.available(backend_named(impl.backend))
        if ok:
            runnable.append(impl)
        else:
            skipped.append((impl, why, backend_ok))
    say_skipped(skipped, getattr(args, "verbose", False))
    if chosen and not runnable:
        console.print("[red]nothing to run: no backend for the selected impls is available here[/]")
        raise SystemExit(3)
    return sorted(runnable, key=lambda i: i.id)


def say_skipped(skipped: list, verbose: bool) -> None:
    """The selected impls not runnable here, each `(impl, why, backend available)`: one line
    counting them by reason (`skipped_line`), or with `verbose` a line per missing backend and
    per impl whose own needs are missing."""
    if not skipped:
        return
    if not verbose:
        console.print(escape(skipped_line(skipped)), style="yellow", soft_wrap=True)
        return
    missing = {}
    for impl, why, backend_ok in skipped:
        missing.setdefault(impl.id if backend_ok else impl.backend, why)
    impls_of = Counter(impl.backend for impl, _, backend_ok in skipped if not backend_ok)
    for what, why in sorted(missing.items()):
        named = f"backend {what} ({impls_of[what]} impls)" if what in impls_of else f"impl {what}"
        console.print(f"[yellow]skipping {named}[/]: {escape(why)}", soft_wrap=True)


def skipped_line(skipped: list) -> str:
    """One line for the impls not runnable here (`say_skipped`), counted per backend under a
    short reason (`short_reason`), e.g. `skipping 75 impls: cuda 55 (cupy not installed),
    torch 18 + mlx 2 (need a GPU); --verbose lists them`."""
    by_reason: dict[str, Counter] = defaultdict(Counter)
    for impl, why, backend_ok in skipped:
        by_reason[short_reason(why, backend_ok)][impl.backend] += 1
    groups = sorted(by_reason.items(), key=lambda item: -sum(item[1].values()))
    parts = [" + ".join(f"{backend} {n}" for backend, n in counts.most_common()) + f" ({reason})"
             for reason, counts in groups]
    n = len(skipped)
    return (f"skipping {n} impl{'s' if n != 1 else ''}: " + ", ".join(parts)
            + "; --verbose lists them")


def short_reason(why: str, backend_ok: bool) -> str:
    """`why` an impl cannot run here, short: "need a GPU" for an impl (its backend present)
    that runs on a GPU only, else the first clause of `why` without parenthesized details
    ("cupy not installed (No module named 'cupy'); pip install ..." -> "cupy not installed")."""
    if backend_ok and ("GPU" in why or "CUDA" in why):
        return "need a GPU"
    return re.sub(r"\s*\([^()]*\)", "", why).split(";")[0].strip() or why


LEFT_OUT_EACH = 3  # at most this many left-out impls get a line each without --verbose


def say_left_out(label: str, whys: dict[str, str], verbose: bool) -> None:
    """Selected impls a verb runs nothing of, `whys` {impl id: why (`timing.why_no_cases`)},
    under `label` ("not checked", "not benched"): a line each where they are few or with
    `verbose`, else one line counting them by reason (`left_out_reason`)."""
    if verbose or len(whys) <= LEFT_OUT_EACH:
        for impl_id, why in whys.items():
            console.print(f"[yellow]{label}:[/] {escape(why or impl_id)}", soft_wrap=True)
        return
    reasons = Counter(left_out_reason(why) for why in whys.values())
    if len(reasons) == 1:
        counted = next(iter(reasons))
    else:
        counted = ", ".join(f"{n}: {reason}" for reason, n in reasons.most_common())
    console.print(f"[yellow]{label}:[/] " + escape(f"{len(whys)} impls ({counted}); --verbose "
                                                   "lists them"), soft_wrap=True)


def left_out_reason(why: str) -> str:
    """The reason of a `why_no_cases` text in a few words, without the impl, its op and the
    filters: shared by the impls one selection leaves out."""
    if " matches " in why and "; its presets" in why:  # "none of the N gate cases of OP ..."
        return "filters match no case"
    if "its contract refuses" in why:
        return "contract refuses all"
    if why.endswith(" cases") and ": its op " in why:  # "its op OP has no bench cases"
        return f"no {why.rsplit(' has no ', 1)[-1][:-1]}"  # "no bench case"
    return why.split(": ", 1)[-1]


def since_filter(args, impls: list, changed: list[str] | None = None) -> list:
    """`--since REF`: those of `impls` that the changes since git ref REF (`changed`: the files,
    where already read) can affect (`runners/since.py`), what was selected and why printed; a
    bad ref is bad input (exit 2)."""
    from runners.since import select_since

    selection = select_since(args.since, changed=changed)
    for line in selection.lines(among=[i.id for i in impls]):
        console.print(escape(line), soft_wrap=True)
    return [i for i in impls if i.id in selection.impl_ids]


def check_presets(args, source=gate_cases, extra=("edge", "violates")) -> list[str]:
    """The --preset values, each checked against the labels of the cases `source(op)` makes."""
    presets = split_csv(args.preset)
    if presets:
        labels = {c.label.split(":", 1)[-1] for op in op_registry() for c in source(op)}
        labels |= set(extra)
        for p in presets:
            if not any(p in label for label in labels):
                if source is gate_cases and any(p in c.label for op in op_registry()
                                                for c in bench_cases(op)):
                    raise UsageError(f"{p!r} is a bench preset: `kparity bench --preset {p}` "
                                     "times it\n  Valid presets here (closest first): "
                                     + closest(p, labels, "`kparity cases --list`", 80))
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
        return case_file_work(args.cases, impls, split_csv(args.dtype),
                              getattr(args, "verbose", False))
    work = plan(impls, dtypes=split_csv(args.dtype) or None, presets=check_presets(args) or None,
                invalid=not getattr(args, "valid_only", False), seed=seed,
                tier=getattr(args, "tier", None) or "nightly")
    return sample_slow_compilers(args, work)


def sample_slow_compilers(args, work: list[Work]) -> list[Work]:
    """An impl that compiles once per case shape (`Impl.gate_cases_max`: torch.compile, seconds
    a shape) runs on the gate's sample of its cases, unless --impl names it: a full GPU sweep
    would otherwise spend most of its time compiling speed baselines (~470 shapes for the five
    compiled torch norms and RoPE). Said in a line per impl where they are few or with
    --verbose, else in one line."""
    named = set(split_csv(getattr(args, "impl", None)))
    by_impl: dict[str, list[Work]] = defaultdict(list)
    for w in work:
        by_impl[w.impl.id].append(w)
    out, cut = [], {}
    for impl_id, items in by_impl.items():
        impl = items[0].impl
        most = impl.gate_cases_max
        if most is None or impl_id in named or impl.name in named:
            out += items
            continue
        kept = sampled(items, most)
        out += kept
        if len(kept) < len(items):
            cut[impl_id] = (len(kept), len(items))
    if getattr(args, "verbose", False) or len(cut) <= LEFT_OUT_EACH:
        for impl_id, (n, of) in cut.items():
            console.print(escape(f"{impl_id}: {n} of its {of} cases (it compiles once per "
                                 f"shape; --impl {impl_id} runs them all)"),
                          style="dim", soft_wrap=True)
    else:
        n, of = (sum(counts) for counts in zip(*cut.values()))
        console.print(f"{len(cut)} impls that compile once per shape run {n} of their {of} "
                      "cases (--impl ID runs all of one; --verbose lists them)", style="dim",
                      soft_wrap=True)
    return out


def case_file_work(path: str, impls, dtypes: list[str], verbose: bool = False) -> list[Work]:
    """Each case of the file against every selected impl of its op: run where the impl's
    contract admits it, recorded as refused where it does not. A report-only impl (a speed
    baseline computing another function) never gates, as in the generated plan. A user's case
    that no selected impl would check is an error, before anything runs: a sweep that launched
    nothing must not read as a pass. Said in two lines, naming the first such case; with
    `verbose`, every such case and each impl's reason."""
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
            unrun.append((f"case {index} ({label}{case.short()})", why))
    if unrun and verbose:
        raise UsageError(f"{path}: " + "".join(
            f"{name} runs on no selected impl:\n" + "".join(f"  {text}\n" for text in why.values())
            for name, why in unrun) + "Change or drop the case, or select an impl that runs it "
            "(--impl; `kparity ops` lists them)")
    if unrun:
        more = f" and {len(unrun) - 1} more run" if len(unrun) > 1 else " runs"
        raise UsageError(f"{path}: {unrun[0][0]}{more} on no selected impl\n  change or drop "
                         "them, or --impl one that runs them (`kparity ops`); --verbose: why "
                         "each impl refuses")
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


def open_store(args):
    """The store the command reads and writes: `--store DIR`, else the default
    (`results.store.default_root`). Every verb opens it here."""
    from results.store import Store

    return Store(getattr(args, "store", None))


def global_flags(args) -> str:
    """The global options a printed command needs to run again as this one did: the store
    (where it is not the default) and every plugin."""
    store = f" --store {args.store}" if getattr(args, "store", None) else ""
    return store + "".join(f" --plugin {p}" for p in getattr(args, "plugin", None) or [])


def repro_line(args, case_id: str, impl_id: str) -> str:
    return f"kparity{global_flags(args)} repro {case_id} --impl {impl_id}"


# runs.filters: what --resume reruns the plan with (seed included: it decides every case id)
FILTERS = ("op", "impl", "backend", "dtype", "preset", "valid_only", "cases", "repeat", "seed",
           "tier")


def add_filter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--op", action="append", help="op name (repeatable, comma-separated)")
    p.add_argument("--impl", action="append", help="impl id backend:name, or name")
    p.add_argument("--backend", action="append", help="cuda, torch, mlx, metal")
    p.add_argument("--dtype", action="append", help="f32, f16, bf16")
    p.add_argument("--preset", action="append",
                   help="case label substring: a model preset, 'edge' or 'violates'")


def verbose_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="a line for each impl skipped (not runnable here) or left out (no case "
                        "to run), with why; default: one line counting them by reason")


def devices_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--devices", default=None, metavar="all|0,1,...",
                   help="spread the work over these GPUs of this host: one isolated worker per "
                        "device (CUDA_VISIBLE_DEVICES), cases dealt in small batches, each row "
                        "tagged with its device_index; 'all': every GPU visible")


def pick_devices(args, backends) -> None:
    """`args.devices` (a `--devices` string) parsed in place into `runners.devices.Device`s;
    a bad value is bad input, before anything runs."""
    if not isinstance(getattr(args, "devices", None), str):
        return
    if getattr(args, "isolate", None) == "none":
        raise UsageError("--devices with --isolate none: each device needs a worker process of "
                         "its own\n  give --isolate case (or impl), or leave --isolate out")
    from runners.devices import parse_devices  # a bad value raises BadInput: exit 2

    args.devices = parse_devices(args.devices,
                                 any(backend_named(b).accelerator for b in set(backends)))


def tier_flag(p: argparse.ArgumentParser, default: str = DEFAULT_TIER) -> None:
    p.add_argument("--tier", choices=TIERS, default=default,
                   help="commit: each impl's smallest gate cases that still cover every dtype "
                        "x distribution, parameter value, dispatch edge and cheap shape it "
                        "admits; nightly: every gate case, real-model shapes included "
                        "(cases/tiers.py; default: %(default)s)")


def add_seed_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="fresh data: add N to every generated case's seed (sources give 0, so it "
                        "becomes N), which changes each case's id and inputs; 0 (default) keeps "
                        "the usual ids. Not with --cases (a file's cases keep their seeds)")
