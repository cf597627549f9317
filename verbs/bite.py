"""`kparity bite`: the bite audit (`runners/bite.py`). Each op's correct reference impl, wrapped in
generic planted mistakes (outputs scaled by 1 + 4 eps or 1 + 16 eps, one element 2 ULPs off, a
row zeroed, every output zeroed, two rows swapped; eps x 10, a quant code off by one, the last
reduction term dropped, a state not updated), is checked over the op's commit-tier cases; per op x dtype x
mistake, the fraction of cases that fail. Exit 1 if some mistake the op does not admit
(`runners.bite.ADMITTED`) passes every case of an op."""

from __future__ import annotations

import time

from rich.markup import escape
from rich.table import Table

from oracle.dtypes import FLOAT_DTYPES
from oracle.spec import registry as op_registry
from verbs.console import console
from verbs.selection import op_and_backend_filters
from verbs.usage import split_csv, unknown

ORDER = 1.5  # a correctness verb: after check and repro, before the timing verbs
GROUP = "correctness"  # its heading in `kparity --help`


def add_parsers(sub) -> None:
    p = sub.add_parser("bite", help="plant generic mistakes in each op's correct impl: "
                                    "which does the gate catch")
    p.add_argument("--op", action="append", help="op name (repeatable, comma-separated)")
    p.add_argument("--backend", action="append",
                   help="the reference impl's backend (default: torch, else mlx)")
    p.add_argument("--dtype", action="append", help="f32, f16, bf16")


def cmd_bite(args) -> int:
    import gpu_impls
    from runners import bite

    started = time.monotonic()
    ops, backends = op_and_backend_filters(args)
    dtypes = split_csv(args.dtype)
    for d in dtypes:
        if d not in FLOAT_DTYPES:
            raise unknown("dtype", d, FLOAT_DTYPES)
    ops = ops or sorted(op_registry())
    audits, none_here = [], []
    for op in ops:
        impl = bite.reference_impl(op, backends or bite.PREFERRED_BACKENDS)
        if impl is None:
            none_here.append(op)
            continue
        t0 = time.monotonic()
        a = bite.audit_op(impl, dtypes or None)
        audits.append(a)
        console.print(escape(f"bite: {op} via {impl.id}: {sum(a.cases.values())} cases "
                             f"({', '.join(f'{d} {n}' for d, n in a.cases.items()) or 'none'})"
                             f", {time.monotonic() - t0:.1f} s"), soft_wrap=True)
    if none_here:
        console.print(escape(f"no correct impl runnable here for: {', '.join(none_here)}"),
                      style="dim", soft_wrap=True)
    if not audits:
        console.print("[red]nothing could run:[/] no selected op has a correct impl on an "
                      "available backend here")
        return 3
    console.print(table(audits, [*bite.MISTAKES, *bite.RUN_MISTAKES]))
    console.print("cell: cases failing / cases counted (+u: the mistake changed no bit in u of "
                  "them); n/a: fits no output; cases the unmutated impl fails are left out "
                  "(runners/bite.py says what each mistake does)", style="dim", soft_wrap=True)
    passing = bite.uncaught(audits, admitted={})  # every (op, mistake) no case caught
    misses = bite.uncaught(audits)
    errors = bite.errored(audits)
    pairs = [(a.op, m) for a in audits for m in dict.fromkeys(m for _, m in a.cells)
             if any(c.n for (_, mm), c in a.cells.items() if mm == m)]
    for op, m, n in passing:
        why = bite.ADMITTED.get(op, {}).get(m)
        if why:
            console.print(escape(f"admitted: {op} {m} passes all {n} cases: {why}"),
                          style="dim", soft_wrap=True)
    for a in audits:  # cases a kernel that writes nothing would pass (issue 49 item 3), where
        # the right answer in T is not zero (`bite.admits_zeros`)
        slipped = [case for (_, m), c in a.cells.items() if m == "zeros" for case in c.slipped
                   if bite.admits_zeros(case)]
        if slipped:
            why = next((r for (op, dist), r in bite.ZERO_ADMITTED.items()
                        if op == a.op and all(c.dist == dist for c in slipped)), None)
            console.print(escape(f"admits the all-zero output: {a.op}, {len(slipped)} case(s) "
                                 f"({', '.join(sorted({c.dist for c in slipped}))}; e.g. case "
                                 f"{slipped[0].id})" + (f": {why}" if why else "")),
                          style="dim" if why else "yellow", soft_wrap=True)
    for c in errors:
        console.print(escape(f"error: {c.op} {c.dtype} {c.mistake}: {c.errors} case(s) raised; "
                             f"{c.messages[0] if c.messages else ''}"), style="red", soft_wrap=True)
    for op, m, n in misses:
        console.print(escape(f"uncaught: {op} {m} passes all {n} cases"), style="red",
                      soft_wrap=True)
    console.print(f"{len(pairs) - len(passing)} of {len(pairs)} (op, mistake) caught, "
                  f"{len(passing) - len(misses)} admitted, {len(misses)} uncaught and not "
                  f"admitted; {len(audits)} ops, {time.monotonic() - started:.0f} s")
    return 1 if misses or errors else 0


def table(audits, mistakes: list[str]) -> Table:
    t = Table(title="bite audit: commit-tier cases failing, per planted mistake")
    for col in ("op", "impl", "dtype", "cases", *mistakes):
        t.add_column(col, no_wrap=col in ("op", "impl"),
                     justify="left" if col in ("op", "impl", "dtype") else "right")
    for a in audits:
        for dtype in a.cases:
            cells = []
            for m in mistakes:
                c = a.cells.get((dtype, m))
                if c is None or not c.n:
                    cells.append("[dim]n/a[/]")
                    continue
                text = f"{c.failed}/{c.n}" + (f" +{c.unchanged}" if c.unchanged else "")
                if c.errors:
                    text += f" [red]{c.errors} err[/]"
                cells.append(f"[red]{text}[/]" if not c.failed else text)
            base = a.baseline.get(dtype, 0)
            t.add_row(a.op, a.impl, dtype,
                      str(a.cases[dtype]) + (f" (-{base})" if base else ""), *cells)
    return t


VERBS = {"bite": cmd_bite}
