"""`kparity model-ab PLAN_A PLAN_B`: the model-level A/B of one kernel lever (issue 28,
`models/ab.py`): both plans gated against the reference plan on the same tokens, then timed in
interleaved decode runs and judged as `kparity ab` judges two impls (ratio of run medians, its
bootstrap 95 % interval, δ from the A/A noise, FASTER / SLOWER / SAME / AMBIGUOUS). A plan is a
builtin plan with swaps appended, the name `kparity model --swap` gives its rows:

    kparity model-ab cuda cuda+rms_norm=cuda:kp_rms_norm            # SmolLM2-135M, one text
    kparity model-ab torch torch+kv_update=torch:static_cache_index_copy --model synthetic:tiny

One `ab` row per text (op "model"). Exit 0 when every A/B ran (and --require holds), 1 when an
arm fails the model gate (it is not timed), a run errs or --require is missed, 2 for bad input,
3 when a plan's backends are not here.
"""

from __future__ import annotations

import statistics

from rich.markup import escape
from rich.table import Table

from results.runinfo import new_run_id, run_row
from verbs.console import console
from verbs.model import model_args
from verbs.selection import backend_named, global_flags, open_store
from verbs.usage import UsageError

ORDER = 2.5  # beside `kparity model` in `kparity --help`
GROUP = "model level"  # its heading in `kparity --help`


def add_parsers(sub) -> None:
    p = sub.add_parser("model-ab", help="model-level A/B of two plans: each gated against the "
                                        "reference, interleaved decode runs, a verdict")
    for name, role in (("plan_a", "the baseline A"), ("plan_b", "B, compared with A")):
        p.add_argument(name, metavar=name.upper(),
                       help=f"{role}: reference, torch, mlx or cuda, each swap appended as "
                            "+ROLE=IMPL (e.g. cuda+rms_norm=cuda:kp_rms_norm)")
    model_args(p)
    p.add_argument("--text", action="append", default=None, metavar="NAME",
                   help="evaluation text, one A/B each (repeatable; default: the first text "
                        "in models/texts/: teacher-forced, the text changes the values, not "
                        "the work)")
    p.add_argument("--tokens", type=int, default=64, metavar="N",
                   help="the first N tokens of each text, one decode step each (64)")
    p.add_argument("--runs", type=int, default=5, help="interleaved runs per arm (>= 5)")
    p.add_argument("--warmup", type=int, default=3, metavar="STEPS",
                   help="untimed decode steps at the start of each run (3)")
    p.add_argument("--require", choices=("faster", "not-slower", "same"),
                   help="exit 1 unless B's verdict against A on every text is this")


def _texts(args, model) -> list[str] | None:
    """--text, or the first committed text (None for a synthetic model: random ids)."""
    if args.text or model.tokenizer is None:
        return args.text
    from models.texts import load_texts

    return sorted(load_texts())[:1]


def cmd_model_ab(args) -> int:
    from models.ab import check_tokens, model_ab, parse_plan
    from models.gate import load_model, text_tokens
    from models.plan import ModelError
    from verbs.timing import MIN_RUNS, ab_exit_code

    if args.runs < MIN_RUNS:
        raise UsageError(f"--runs {args.runs}: the verdict needs at least {MIN_RUNS} runs per "
                         f"arm (runs, not steps, are the unit of replication); pass --runs "
                         f"{MIN_RUNS}")
    if args.warmup < 0:
        raise UsageError(f"--warmup {args.warmup}: a number of steps, at least 0")
    try:
        plan_a, plan_b = parse_plan(args.plan_a), parse_plan(args.plan_b)
        model = load_model(args.model, args.seed)
        tokens = text_tokens(model, _texts(args, model), args.tokens)
        for text, ids in tokens.items():  # every text before the first is timed
            check_tokens(text, len(ids), args.warmup)
    except ModelError as e:
        raise UsageError(str(e)) from e
    store = open_store(args)
    store.ensure_writable()
    run_id = new_run_id()
    rows, arms = [], {}
    try:
        for text, ids in tokens.items():
            with console.status(f"{model.name}, {text}: gating {plan_a.name} and "
                                f"{plan_b.name} against the reference") as status:
                def heard(letter, rep, ms):
                    status.update(f"{model.name}, {text}: run {rep + 1}/{args.runs} of "
                                  f"{letter}: {ms:.3f} ms/token")
                row, arms[text] = model_ab(
                    model, plan_a, plan_b, args.dtype, text, ids, runs=args.runs,
                    warmup=args.warmup, max_mean_kld=args.max_mean_kld,
                    min_same_top=args.min_same_top, run_id=run_id, on_run=heard)
            rows.append(row)
    except ModelError as e:
        raise UsageError(str(e)) from e
    except RuntimeError as e:  # a backend a plan needs is not here
        console.print(f"[red]nothing could run[/red]: {escape(str(e))}")
        return 3
    devices = {b: d for by_letter in arms.values() for arm in by_letter.values()
               for b, d in arm.devices.items()}
    versions = {k: v for b in devices if b != "numpy"
                for k, v in backend_named(b).versions().items()}
    filters = {k: getattr(args, k) for k in ("plan_a", "plan_b", "model", "dtype", "text",
                                             "tokens", "seed", "runs", "warmup")}
    store.write("runs", [run_row(run_id, "model-ab", devices, versions, filters)], run_id, 0)
    store.write("ab", rows, run_id, 1)
    _print(rows, arms, run_id, model.name, ", ".join(sorted(set(devices.values()))))
    for row in rows:
        if row["status"] != "ok":
            console.print(f"[red]{row['status'].upper()}[/] {row['impl_b']} against "
                          f"{row['impl_a']} on {row['label']}: {escape(row['message'])}\n"
                          + escape(repro(args, row)), soft_wrap=True)
    console.print(f"{len(rows)} model A/B(s), {sum(r['status'] != 'ok' for r in rows)} not "
                  f"timed or failed; rows in {store.root}/")
    return ab_exit_code(rows, args.require)


def repro(args, row: dict) -> str:
    text = "" if args.model.startswith("synthetic:") else f" --text {row['label']}"
    return (f"repro: kparity{global_flags(args)} model-ab {row['impl_a']} {row['impl_b']} "
            f"--model {args.model} --dtype {args.dtype}{text} --tokens {args.tokens} "
            f"--seed {args.seed}")


def _kld(arm) -> str:
    if arm is None:
        return "-"
    colour = {"pass": "green", "fail": "red"}.get(arm.gate, "yellow")
    return f"{arm.summary['mean_kld']:.3g} [{colour}]{arm.gate}[/]"


def _print(rows: list[dict], arms: dict, run_id: str, model: str, device: str) -> None:
    from verbs.timing import COLOUR

    first = rows[0]
    table = Table(title=f"model-ab {run_id}: B = {first['impl_b']} against A = "
                        f"{first['impl_a']} ({model}, {first['dtype']}, {device}), ms per "
                        "token, run medians")
    cols = ("text", "A ms", "B ms", "B/A", "95% CI", "δ", "verdict", "A mean KLD",
            "B mean KLD", "A=B ulp")
    for col in cols:
        table.add_column(col, justify="left" if col in ("text", "verdict") else "right")
    for r in rows:
        arm = arms.get(r["label"], {})
        kld = [_kld(arm.get("A")), _kld(arm.get("B")),
               "-" if r.get("ab_max_ulp") is None else str(r["ab_max_ulp"])]
        if r["status"] != "ok":
            table.add_row(r["label"], "-", "-", "-", "-", "-", f"[red]{r['status']}[/]", *kld)
            continue
        a, b = (statistics.median(r[k]) / 1e6 for k in ("runs_a_ns", "runs_b_ns"))
        v = r["verdict"]
        table.add_row(r["label"], f"{a:.3f}", f"{b:.3f}", f"{r['ratio']:.3f}",
                      f"[{r['ci_lo']:.3f}, {r['ci_hi']:.3f}]", f"{100 * r['delta']:.1f}%",
                      f"[{COLOUR[v]}]{v}[/]", *kld)
    console.print(table)


VERBS = {"model-ab": cmd_model_ab}
