"""The model-level A/B of one kernel lever (issue 28, `kparity model-ab PLAN_A PLAN_B`): two
plans' decode loops on the same tokens, each gated against the reference plan, then timed in
interleaved runs and judged as `kparity ab` judges two impls of one op (`runners/ab.py`).

    plans    A, B: a builtin plan, each swap appended as "+ROLE=IMPL" (`parse_plan`):
             "cuda+rms_norm=cuda:kp_rms_norm" is the name `Plan.swapped` gives, so a `model`
             row's plan reads back as an arm
    gate     each arm's teacher-forced logits on the tokens against the reference plan's
             (`models/metrics.py`), judged as `kparity model` judges a plan: pass, fail, or
             report (the reference itself, a plan with a report-only impl)
    runs     `runs` interleaved runs A B A B ...; one run is `time_decode` over the tokens (the
             first `warmup` steps untimed), its value the median ms per token of its steps
    verdict  `runners.abstats.compare_runs` on the run medians: the ratio median(B)/median(A)
             with its bootstrap 95 % interval, the A/A noise, δ, FASTER/SLOWER/SAME/AMBIGUOUS

An arm that fails the gate is not timed and the A/B is `fail`, as an op A/B with a wrong arm:
a faster wrong kernel is not a lever. The gate's logits pass is also each decoder's warm-up
(first-call allocations, lazy kernel builds), so no run pays for them. The run, not the step,
is the unit of replication: steps in one run share the caches' placement and the clocks.

One row of the `ab` table (`results/schema.py`) per (A, B, text): op "model", impl_a/impl_b the
plans' names, dims the model config (JSON, with the model's name, seed and token count), label
the text, mode "decode", correct_a/correct_b the arms' gates, runs_a_ns/runs_b_ns the run
medians in ns per token, ab_max_abs/ab_max_ulp the A and B logits against each other.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
from dataclasses import dataclass

import numpy as np

from models.decode import Decoder
from models.decode_speed import time_decode
from models.gate import PlanArm, judge
from models.plan import ModelError, Plan, plan as builtin_plan
from oracle.dtypes import ulp_distance
from runners.abstats import compare_runs

MODE = "decode"  # batch-1 decode steps, wall time between synchronizes (`time_decode`)


def parse_plan(spec: str) -> Plan:
    """A builtin plan with the swaps its spec appends: "torch", "cuda+rms_norm=cuda:kp_rms_norm"
    (several: "+a=X+b=Y"). ModelError names a malformed swap, an unknown plan, role or impl."""
    name, *swaps = spec.split("+")
    pairs = {}
    for item in swaps:
        key, sep, impl_id = item.partition("=")
        if not sep or not key or not impl_id:
            raise ModelError(f"plan {spec!r}: {item!r} is not ROLE=IMPL; write a plan as "
                             "NAME[+ROLE=IMPL...], e.g. cuda+rms_norm=cuda:kp_rms_norm")
        if key in pairs:
            raise ModelError(f"plan {spec!r}: {key} is swapped twice; keep one {key}=IMPL")
        pairs[key] = impl_id
    base = builtin_plan(name)
    return base.swapped(pairs) if pairs else base


@dataclass(frozen=True)
class Arm:
    """One arm's correctness on the tokens: its plan's name, the gate (pass / fail / report)
    with its reasons, llama-perplexity's summary against the reference (`metrics.summary`),
    and where it ran."""

    plan: str
    gate: str
    reasons: tuple[str, ...]
    summary: dict
    devices: dict  # backend name -> its device, for the runs row


def arm_text(arm: Arm) -> str:
    """"mean KLD 3.1e-06 ± 4e-07, same top 100.00 % (pass)": an arm's correctness in a line."""
    s = arm.summary
    return (f"mean KLD {s['mean_kld']:.3g} ± {s['mean_kld_unc']:.2g}, same top "
            f"{100 * s['same_top_p']:.2f} % ({arm.gate})")


def case_id(model, dtype: str, text: str, ids: np.ndarray) -> str:
    """What the two arms ran on, as a stable 12-hex id (as a case id): the model (name, file
    hash, seed), the dtype, the text and its token ids; the same A/B target across runs."""
    key = {"model": model.name, "sha256": model.sha256, "seed": model.seed, "dtype": dtype,
           "text": text, "ids": [int(i) for i in ids]}
    blob = json.dumps(key, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def logit_agreement(a: np.ndarray, b: np.ndarray, dtype: str) -> tuple[float, int | None]:
    """(max |A - B|, max ULP distance in T) of two plans' logits; a non-finite logit in either
    gives (0, 0) where both agree bit for bit, else (inf, None)."""
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        same = np.array_equal(a, b, equal_nan=True)
        return (0.0, 0) if same else (float("inf"), None)
    return float(np.max(np.abs(a - b))), int(np.max(ulp_distance(a, b, dtype)))


def check_tokens(text: str, n: int, warmup: int) -> None:
    """ModelError unless `n` tokens leave a step to time after `warmup` and 2 to score."""
    if n < 2 or n <= warmup:
        raise ModelError(f"text {text}: {n} tokens leave no decode step to time after "
                         f"{warmup} warm-up steps (and at least 2 are scored): raise --tokens "
                         "or lower --warmup")


def model_ab(model, plan_a: Plan, plan_b: Plan, dtype: str, text: str, ids: np.ndarray,
             runs: int = 5, warmup: int = 3, max_mean_kld: float = 1e-4,
             min_same_top: float = 0.99, run_id: str = "",
             on_run=None) -> tuple[dict, dict[str, Arm]]:
    """The A/B of `plan_b` against `plan_a` on `ids` (module docstring): (the `ab` row, the
    arms' `Arm` by letter, empty where the row is an error before the gate). `on_run(letter,
    rep, ms_per_token)` hears each run as it ends. ModelError (before anything runs) for tokens
    that leave no timed step; a plan that cannot run here raises from `Decoder` as it does for
    `kparity model`; an arm raising while it runs makes the row `error`."""
    ids = np.asarray(ids)
    check_tokens(text, len(ids), warmup)
    cfg = dataclasses.asdict(model.weights.config)
    dims = {**cfg, "model": model.name, "seed": model.seed, "tokens": int(len(ids))}
    row = {"run_id": run_id, "ab_id": secrets.token_hex(6),
           "case_id": case_id(model, dtype, text, ids), "impl_a": plan_a.name,
           "impl_b": plan_b.name, "op": "model", "dtype": dtype,
           "dims": json.dumps(dims, sort_keys=True), "label": text, "mode": MODE,
           "status": "error", "message": "", "runs_a_ns": [], "runs_b_ns": []}
    plan_arms = {"A": PlanArm(model, plan_a, dtype, len(ids)),
                 "B": PlanArm(model, plan_b, dtype, len(ids))}
    arms: dict[str, Arm] = {}
    try:
        ref = Decoder(model.weights, "reference", dtype, max_len=len(ids)).logits(ids)
        logits = {}
        for letter, pa in plan_arms.items():
            logits[letter] = pa.logits(ids)
            s, _, _, gate, reasons = judge(pa, ref, logits[letter], ids, max_mean_kld,
                                           min_same_top)
            arms[letter] = Arm(pa.name, gate, tuple(reasons), s,
                               {n: b.device() for n, b in pa.decoder.backends.items()})
        row["correct_a"], row["correct_b"] = arms["A"].gate, arms["B"].gate
        row["ab_max_abs"], row["ab_max_ulp"] = logit_agreement(logits["A"], logits["B"], dtype)
        wrong = [f"{letter} = {arm.plan} not timed: it fails the model gate "
                 f"({'; '.join(arm.reasons)})" for letter, arm in arms.items()
                 if arm.gate == "fail"]
        if wrong:
            row.update(status="fail", message="; ".join(wrong))
            return row, arms
        medians = {"A": [], "B": []}
        for rep in range(runs):
            for letter, pa in plan_arms.items():  # interleaved: A B A B ...
                ms = time_decode(pa.decoder, ids, warmup=warmup).ms_per_token
                medians[letter].append(ms * 1e6)
                if on_run is not None:
                    on_run(letter, rep, ms)
        row["runs_a_ns"], row["runs_b_ns"] = medians["A"], medians["B"]
        row.update(compare_runs(medians["A"], medians["B"]), status="ok",
                   message="; ".join(f"{k}: {arm_text(arm)}" for k, arm in arms.items()))
    except Exception as e:  # a kernel that raises is a row, as in `kparity ab`
        row["message"] = f"{type(e).__name__}: {e}"
    return row, arms
