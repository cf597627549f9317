"""`kparity model`: the model-level gate (issue 28, `models/gate.py`): a real model's decode
loop made of kparity's ops, a plan's logits against the float64 reference plan's, llama-
perplexity's KLD statistics, the gate's verdict, and (with --speed) tokens/s beside the
bandwidth roofline; one `model` table row per (model, plan, text).

    kparity model --plan torch --dtype f16 --tokens 48              # SmolLM2-135M, every text
    kparity model --plan cuda --swap rms_norm=cuda:kp_rms_norm      # one kernel lever
    kparity model --model synthetic:tiny --plan mlx                 # random int4 weights
    kparity model --plan torch,hf-bf16 --speed                      # beside transformers

The transformers baselines (`models/baseline_hf.py`: hf-bf16, hf-f32, hf-bf16-compiled) stand
in --plan beside the plans: the same GGUF run by transformers, in its own dtype, reported
(never gated); --swap changes the plans only.

Exit 0 when every row passes its gate (the reference plan is report-only), 1 when one fails,
2 for bad input, 3 when the plan's backends are not here.
"""

from __future__ import annotations

import argparse
import math
import time

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.progress import TimeRemainingColumn
from rich.table import Table

from results.runinfo import new_run_id, run_row
from verbs.console import console
from verbs.selection import backend_named, global_flags, open_store
from verbs.usage import UsageError

ORDER = 2.5  # after check, repro, bench and ab in `kparity --help`, before history
GROUP = "model level"  # its heading in `kparity --help`


def model_args(p: argparse.ArgumentParser) -> None:
    """The model under test and the gate's limits, shared by `model` and `model-ab`."""
    p.add_argument("--model", default="smollm2",
                   help="smollm2 (SmolLM2-135M-Instruct Q4_1, downloaded once and cached) or "
                        "synthetic:CONFIG (tiny, smollm2-135m, llama3-8b: random int4 weights)")
    p.add_argument("--dtype", default="f16",
                   help="activation dtype T (f16 keeps a Q4_1 file's f16 scales exact; bf16 "
                        "would round them and is refused for it)")
    p.add_argument("--seed", type=int, default=0, help="synthetic weights' and ids' seed")
    p.add_argument("--max-mean-kld", type=float, default=1e-4, metavar="X",
                   help="the gate's mean KLD limit (1e-4: models.metrics.gate says why)")
    p.add_argument("--min-same-top", type=float, default=0.99, metavar="P",
                   help="the gate's same-top-token fraction (0.99)")


def add_parsers(sub) -> None:
    p = sub.add_parser("model", help="model-level gate: a plan's logits against the reference, "
                                     "KLD statistics, tokens/s")
    model_args(p)
    p.add_argument("--plan", default="torch",
                   help="reference, torch, mlx or cuda: which impl runs each op; or a "
                        "transformers baseline: hf-bf16, hf-f32, hf-bf16-compiled (CUDA); "
                        "several, comma-separated, share one reference run (e.g. torch,hf-bf16)")
    p.add_argument("--swap", action="append", default=[], metavar="OP=IMPL",
                   help="run one op (or role) with another impl, e.g. rms_norm=cuda:kp_rms_norm "
                        "(repeatable)")
    p.add_argument("--text", action="append", default=None, metavar="NAME",
                   help="evaluation text (repeatable; default: every text in models/texts/)")
    p.add_argument("--tokens", type=int, default=64, metavar="N",
                   help="the first N tokens of each text (64)")
    p.add_argument("--speed", action="store_true",
                   help="also time the decode steps (ms per token, tokens/s, roofline; a CUDA "
                        "plan's steps as a CUDA graph, the eager step beside it) and a prefill")
    p.add_argument("--prefill", type=int, default=512, metavar="N",
                   help="with --speed: time a prefill pass over a prompt of N tokens (512; "
                        "0: none)")
    p.add_argument("--batch", type=int, default=8, metavar="N",
                   help="with --speed: also time a decode of N sequences at once (8; 0: none)")
    p.add_argument("--speed-only", action="store_true",
                   help="time only, no reference and no gate (a model too large for the "
                        "float64 reference: --model synthetic:llama3-8b); implies --speed")


def _swaps(given: list[str]) -> dict[str, str]:
    out = {}
    for item in given:
        key, sep, impl = item.partition("=")
        if not sep or not key or not impl:
            raise UsageError(f"--swap {item!r}: write OP=IMPL, e.g. rms_norm=cuda:kp_rms_norm")
        out[key] = impl
    return out


def cmd_model(args) -> int:
    from models.baseline_hf import baseline
    from models.gate import evaluate, load_model, plan_or_baseline, text_tokens
    from models.plan import ModelError
    from runners.bench import ceilings_row

    try:
        swaps = _swaps(args.swap)
        plans = [plan_or_baseline(name) for name in args.plan.split(",") if name]
        if swaps:  # a baseline (its name) has no ops to swap
            plans = [p if isinstance(p, str) else p.swapped(swaps) for p in plans]
        for name in (p for p in plans if isinstance(p, str)):  # before the model loads
            ok, why = baseline(name).available()
            if not ok:
                console.print(f"[red]nothing could run[/red]: {name}: {why}")
                return 3
        if args.prefill < 0:
            raise ModelError(f"--prefill {args.prefill}: a prompt length, or 0 for none")
        if args.batch < 0 or args.batch == 1:
            raise ModelError(f"--batch {args.batch}: a batch of 2 or more sequences, or 0 for "
                             "none (batch 1 is always timed)")
        speed = args.speed or args.speed_only
        with console.status(f"loading {args.model}"):
            model = load_model(args.model, args.seed)
            tokens = text_tokens(model, args.text, args.tokens)
    except ModelError as e:
        raise UsageError(str(e)) from e
    store = open_store(args)
    store.ensure_writable()
    run_id = new_run_id()
    ceilings = []

    def ceiling(backend: str) -> float:
        row = ceilings_row(run_id, backend, backend_named(backend))
        ceilings.append(row)
        return row["copy_gbps"]

    try:
        what = args.plan if args.speed_only else f"reference and {args.plan}"
        with Bars(f"{model.name}: {what} over {len(tokens)} text(s)") as bars:
            rows = evaluate(model, plans, args.dtype, tokens, speed=speed,
                            ceiling=ceiling, max_mean_kld=args.max_mean_kld,
                            min_same_top=args.min_same_top, prefill=args.prefill,
                            compare=not args.speed_only, batch=args.batch, progress=bars)
    except ModelError as e:
        raise UsageError(str(e)) from e
    except RuntimeError as e:  # a backend the plan needs is not here
        console.print(f"[red]nothing could run[/red]: {e}")
        return 3
    devices = {r["backend"]: r["device"] for r in rows}
    filters = {k: getattr(args, k) for k in ("model", "plan", "swap", "dtype", "text", "tokens",
                                             "seed", "speed", "prefill", "speed_only",
                                             "batch")}
    store.write("runs", [run_row(run_id, "model", devices, {}, filters)], run_id, 0)
    if ceilings:
        store.write("ceilings", ceilings, run_id, 0)
    store.write("model", [{**r, "run_id": run_id} for r in rows], run_id, 1)
    for name in dict.fromkeys(r["plan"] for r in rows):
        _print([r for r in rows if r["plan"] == name], speed, not args.speed_only)
    for r in rows:
        if r["gate"] == "report" and r["gate_reasons"]:
            console.print(f"report {r['plan']} on {r['text']}: {r['gate_reasons']}")
    failing = [r for r in rows if r["gate"] == "fail"]
    for r in failing:
        text = "" if args.model.startswith("synthetic:") else f" --text {r['text']}"
        console.print(f"[red]FAIL[/red] {r['plan']} on {r['text']}: {r['gate_reasons']}\n"
                      f"repro: kparity{global_flags(args)} model --model {args.model} "
                      f"--plan {args.plan}" + "".join(f" --swap {s}" for s in args.swap)
                      + f" --dtype {args.dtype}{text} --tokens {args.tokens} --seed {args.seed}")
    verdict = "FAIL" if failing else "OK"
    console.print(f"{verdict}: {len(rows)} (plan, text) rows, {len(failing)} failing the gate "
                  f"(mean KLD <= {args.max_mean_kld:g}, same top >= {args.min_same_top:.0%}); "
                  f"rows in {store.root}/")
    return 1 if failing else 0


class Bars:
    """`evaluate`'s progress (a `models.gate.Progress`) on the console: a bar for the stage
    running (its tokens, its ETA) and one for the whole run, counted in the stages' estimated
    seconds (`Stage.seconds`: rich's ETA from them corrects itself when the steps run faster or
    slower than the few timed up front); where the estimate is a minute or more, one line says
    so before the first stage. Off a terminal (CI, a pipe) the bars draw nothing: a line every
    `every` seconds says where the run is."""

    estimate = True

    def __init__(self, what: str, every: float = 30.0):
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(),
                             TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
                             TextColumn("eta"), TimeRemainingColumn(), console=console,
                             transient=True)
        self.what, self.every = what, every
        self.whole = self.bars.add_task(f"{what}: building the decoders, timing a few steps",
                                        total=None, count="")
        self.step = None
        self.stages: list = []
        self.weights: list[float] = []  # each stage's share of the whole bar
        self.done = 0.0  # of the whole bar
        self.started = self.last_line = time.monotonic()

    def __enter__(self):
        self.bars.__enter__()
        return self

    def __exit__(self, *exc):
        return self.bars.__exit__(*exc)

    def plan(self, stages, device: str) -> None:
        """The whole bar's units: estimated seconds where every decode stage has them, else
        stages; the estimate's line where it is a minute or more."""
        self.stages = stages
        estimated = [s.seconds for s in stages if s.seconds is not None]
        timed = bool(estimated) and all(s.seconds is not None or s.what == "prefill"
                                        for s in stages)
        self.weights = [(s.seconds or 0.0) if timed else 1.0 for s in stages]
        self.bars.update(self.whole, description=self.what, total=sum(self.weights) or 1,
                         completed=0, count=f"0/{len(stages)} stages")
        total = sum(estimated)
        if total >= 60:
            by_who: dict[str, float] = {}
            for s in stages:
                by_who[s.who] = by_who.get(s.who, 0.0) + (s.seconds or 0.0)
            parts = ", ".join(f"{who} {sec / 60:.1f}" for who, sec in by_who.items())
            unknown = " + the prefill passes" if any(s.what == "prefill" for s in stages) else ""
            console.print(f"estimate: about {total / 60:.1f} min on {escape(device)} ({parts} "
                          f"min{unknown}), from the first text's first steps")

    def start(self, stage):
        """The stage bar reset to `stage`; the whole bar at the stages before it."""
        i = self.stages.index(stage)
        self.done = sum(self.weights[:i])
        self.bars.update(self.whole, completed=self.done, count=f"{i}/{len(self.stages)} stages")
        if self.step is None:
            self.step = self.bars.add_task(stage.label, total=stage.tokens, count="")
        else:
            self.bars.reset(self.step, total=stage.tokens, description=stage.label)
        per_token = self.weights[i] / stage.tokens
        tokens = [0]

        def tokens_done(n: int) -> None:
            tokens[0] += n
            self.done += n * per_token
            self.bars.update(self.step, completed=tokens[0],
                             count=f"{tokens[0]}/{stage.tokens} tokens")
            self.bars.update(self.whole, completed=self.done)
            self._line(stage, tokens[0])

        tokens_done(0)
        return tokens_done

    def _line(self, stage, tokens: int) -> None:
        """Off a terminal: where the run is, once every `every` seconds."""
        now = time.monotonic()
        if self.bars.console.is_terminal or now - self.last_line < self.every:
            return
        self.last_line = now
        share = self.done / (sum(self.weights) or 1)
        console.print(escape(f"model: {now - self.started:.0f} s, {share:.0%} done; now "
                             f"{stage.label}, {tokens}/{stage.tokens} tokens"), soft_wrap=True)


def _fmt(v, spec: str = ".3g") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _print(rows: list[dict], speed: bool, compared: bool = True) -> None:
    r0 = rows[0]
    title = f"{r0['model']}: plan {r0['plan']}" + (" against the reference" if compared else "")
    table = Table(title=f"{title} ({r0['dtype']}, {r0['device']})")
    cols = ["text"]
    tails = compared and not speed  # the KLD order statistics: a narrower table with speed
    if compared:
        cols += ["n", "mean KLD", *(["median", "99 %"] if tails else []), "max", "same top",
                 "RMS Δp", "flips (ties)", "gate"]
    if speed:
        cols += ["ms/token", "tok/s", "step", "eager tok/s", "roofline tok/s", "% roofline",
                 "batch tok/s", "prefill tok/s"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("text", "gate", "step") else "right")
    for r in rows:
        cells = [r["text"]]
        if compared:
            cells += [str(r["positions"]),
                      f"{_fmt(r['mean_kld'])} ± {_fmt(r['mean_kld_unc'], '.2g')}",
                      *([_fmt(r["median_kld"]), _fmt(r["kld_99"])] if tails else []),
                      _fmt(r["max_kld"]), f"{_fmt(100 * r['same_top_p'], '.2f')} %",
                      _fmt(r["rms_dp"]), f"{r['flips']} ({r['near_ties']})", r["gate"]]
        if speed:
            roof = r["roofline_tok_s"]
            cells += [_fmt(r["ms_per_token"], ".3f"), _fmt(r["decode_tok_s"], ".1f"),
                      r["decode_mode"] or "-", _fmt(r["eager_tok_s"], ".1f"), _fmt(roof, ".0f"),
                      _fmt(roof and 100 * r["decode_tok_s"] / roof, ".1f"),
                      "-" if r["batch_tok_s"] is None else
                      f"{r['batch_tok_s']:.0f} ({r['batch_size']})",
                      "-" if r["prefill_tok_s"] is None else
                      f"{r['prefill_tok_s']:.0f} ({r['prefill_tokens']})"]
        table.add_row(*cells)
    console.print(table)


VERBS = {"model": cmd_model}
