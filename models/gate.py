"""The model-level gate (issue 28): a plan's teacher-forced logits against the reference plan's
over the evaluation texts, llama-perplexity's statistics (`models/metrics.py`), the gate's
verdict, and the speed; one `model` table row per (model, plan, text).

    tokens   the text's token ids (the model's own tokenizer; a synthetic model: random ids
             from the seed), the first `limit` of them
    ref      Decoder(weights, "reference", T).logits(tokens, prefill=len(tokens))
                                                               float64 oracles, T between ops
                                                               (`reference_logits`)
    test     Decoder(weights, plan, T).logits(tokens)          the plan's impls
    scored   positions 0 .. n-2: the logits after token i against token i + 1

The reference is the exact composition of the ops at the contracts' rounding points, so a plan
whose kernels are correct differs from it only by f32-versus-float64 arithmetic and the roundings
that arithmetic tips over: the gate's defaults (mean KLD <= 1e-4, same top >= 99 %, the reasoning
in `models.metrics.gate`) hold for such a plan; a wrong kernel moves the KLD by orders of
magnitude (tests/test_model_gate.py). A plan with a report-only impl (e.g. MLX's half-precision
quantized matmul, `mlx:quantized_matmul_half`, which rounds inside its product by rules not yet
modelled) computes another function: its row is `report`, not gated. Top-token flips are
near-tie aware: a flip between tokens whose reference gap is within `metrics.margin_bound` (the
logit-difference perturbation the KLD bound admits, 4 σ: 0.08 nats at 1e-4) is a near tie,
counted as agreeing in the gate's same-top (the row's `same_top_p` stays llama-perplexity's,
every flip counted); any other flip fails the row (`flips`).

Arms (`Arm`): each row compares one arm with the reference. A plan is one (`PlanArm`, its
`Decoder`); a baseline (`models/baseline_hf.py`: hf-bf16, hf-f32, hf-bf16-compiled, the same
GGUF run by `transformers`) is another, always `report`: it computes another function (bf16 or
f32 weights and activations). Its row's dtype is its own, not the reference's T.

Speed (`speed=True`): decode ms per token at batch 1 (median over the steps after a warm-up,
`models.decode_speed.time_decode`) and its tokens/s; the roofline beside it is the bytes a step
reads (`models.decode_speed.step_bytes`, the ops' own byte models, at the text's middle position)
over the run's copy ceiling.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from gpu_impls import impls
from models import metrics
from models.decode import Decoder
from models.decode_speed import DecodeTiming, PrefillTiming, step_bytes, time_decode, time_prefill
from models.plan import PLANS, ModelError, Plan, plan as builtin_plan
from models.weights import Weights

SYNTHETIC = "synthetic:"
REAL = "smollm2"


@dataclass(frozen=True)
class Model:
    """The weights under test, their tokenizer (None: synthetic ids) and where they came from."""

    name: str
    weights: Weights
    tokenizer: object | None
    sha256: str
    seed: int = 0
    path: Path | None = None  # the GGUF file (None: synthetic), for the transformers baselines


def load_model(name: str, seed: int = 0) -> Model:
    """`smollm2` (SmolLM2-135M-Instruct Q4_1, downloaded and cached) or `synthetic:CONFIG`
    (random int4 weights of `models.synthetic.CONFIGS[CONFIG]`)."""
    if name == REAL:
        from models.gguf_file import SHA256, fetch, load_weights
        from models.tokenizer import load_tokenizer

        path = fetch()
        return Model(name, load_weights(path), load_tokenizer(path), SHA256, seed, path)
    if name.startswith(SYNTHETIC):
        from models.synthetic import config, random_weights

        try:
            cfg = config(name[len(SYNTHETIC):])
        except ValueError as e:
            raise ModelError(str(e)) from e
        return Model(name, random_weights(cfg, seed), None, "", seed)
    from models.synthetic import CONFIGS

    raise ModelError(f"unknown model {name!r}: {REAL}, or "
                     + ", ".join(SYNTHETIC + c for c in CONFIGS))


def text_tokens(model: Model, names: list[str] | None, limit: int) -> dict[str, np.ndarray]:
    """{text name: its first `limit` token ids}; a synthetic model: one random sequence."""
    if limit < 2:
        raise ModelError(f"--tokens {limit}: at least 2 (the logits after token i are scored "
                         "against token i + 1)")
    if model.tokenizer is None:
        rng = np.random.default_rng(model.seed)
        return {f"random-{model.seed}": rng.integers(0, model.weights.config.vocab, limit)}
    from models.texts import load_texts

    texts = load_texts()
    chosen = names or sorted(texts)
    unknown = [n for n in chosen if n not in texts]
    if unknown:
        raise ModelError(f"unknown text {unknown[0]!r}; texts: {', '.join(sorted(texts))}")
    return {n: np.asarray(model.tokenizer.encode(texts[n])[:limit]) for n in chosen}


class Arm(Protocol):
    """One arm compared with the reference: a plan's decode loop (`PlanArm`) or a baseline
    (`models.baseline_hf.HFArm`). `gated`: its row gets pass/fail (else `report`); `notes`:
    why not, shown as the row's first reasons; `backend` / `device`: the row's columns;
    `timed_backend`: the kparity backend whose copy ceiling bounds it (None: untimed)."""

    name: str
    dtype: str
    backend: str
    device: str
    timed_backend: str | None
    gated: bool
    notes: list[str]

    def describe(self) -> dict: ...

    def logits(self, ids: np.ndarray) -> np.ndarray: ...

    def time(self, ids: np.ndarray) -> DecodeTiming: ...

    def time_eager(self, ids: np.ndarray) -> DecodeTiming | None:
        """The eager step's timing where `time` replays a CUDA graph (None: `time` is eager)."""

    def time_prefill(self, ids: np.ndarray) -> PrefillTiming | None:
        """The prefill pass over all of `ids` as one prompt (None: not timed)."""

    def time_batch(self, ids: np.ndarray) -> DecodeTiming | None:
        """Decode steps over a batch: `ids` [batch, T], one sequence per row (None: not
        timed)."""

    def step_bytes(self, position: int) -> int: ...


class PlanArm:
    """A plan run by kparity's decode loop (`models.decode.Decoder`) as an `Arm`. `graph`:
    its decode steps (logits and timing) as a CUDA graph (`Decoder.use_graph`); None: where
    the plan can be (`Decoder.graph_refusal`: every op on the GPU), the reference excepted."""

    def __init__(self, model: Model, plan: Plan, dtype: str, max_len: int,
                 graph: bool | None = None):
        self.plan, self.name, self.dtype = plan, plan.name, dtype
        self.decoder = dec = Decoder(model.weights, plan, dtype, max_len=max_len)
        if graph is None:
            graph = plan.name != "reference" and dec.graph_refusal() is None
        if graph:
            dec.use_graph()
        self.backend = ", ".join(sorted(dec.backends))
        self.device = ", ".join(sorted({b.device() for b in dec.backends.values()}))
        self.timed_backend = next((b for b in sorted(dec.backends) if b != "numpy"), None)
        ungated = sorted({i for ids_ in dec.impls.values() for i in ids_
                          if i in impls() and impls()[i].report_only})
        # not the oracle-exact-rounding plan the gate's defaults are for
        self._notes = [f"report only: {', '.join(ungated)} compute(s) another function than "
                       "the op's contract (`Impl.report_only`)"] if ungated else []
        self.gated = plan.name != "reference" and not ungated

    @property
    def on_tokens(self):
        """The decoder's `on_tokens` (the progress bars)."""
        return self.decoder.on_tokens

    @on_tokens.setter
    def on_tokens(self, fn) -> None:
        self.decoder.on_tokens = fn

    @property
    def notes(self) -> list[str]:
        """Why not gated, and what the decoder noted (a failed graph capture, a host path)."""
        return [*self._notes, *self.decoder.notes]

    def describe(self) -> dict:
        return self.decoder.impls

    def logits(self, ids):
        return self.decoder.logits(ids)

    def time(self, ids):
        return time_decode(self.decoder, ids)

    def time_eager(self, ids):
        if not self.decoder.graph:  # `time` was eager (or the capture failed: in `notes`)
            return None
        self.decoder.use_graph(False)
        try:
            return time_decode(self.decoder, ids)
        finally:
            self.decoder.use_graph(True)

    def time_prefill(self, ids):
        return time_prefill(self.decoder, ids)

    def time_batch(self, ids):
        """`ids` [batch, T] by a decoder of that batch (each projection a qmm over the batch's
        rows), stepped as this arm steps (a CUDA graph where it replays one), built per call."""
        dec = self.decoder
        batched = Decoder(dec.weights, dec.plan, dec.dtype, max_len=dec.max_len,
                          batch=len(ids))
        batched.on_tokens = dec.on_tokens
        if dec.graph:
            batched.use_graph()
        timing = time_decode(batched, ids)
        self.decoder.notes.extend(f"batch {len(ids)}: {n}" for n in batched.notes
                                  if n not in self.decoder.notes)
        return timing

    def step_bytes(self, position):
        return step_bytes(self.decoder, position)


def is_baseline(name: str) -> bool:
    from models.baseline_hf import BASELINES

    return name in BASELINES


def plan_or_baseline(name: str) -> Plan | str:
    """A builtin plan (`models.plan.PLANS`) or a baseline's name (`models.baseline_hf`), else
    ModelError listing both, closest first."""
    from cases.casefile import closest
    from models.baseline_hf import BASELINES

    if name in BASELINES:
        return name
    if name in PLANS:
        return builtin_plan(name)
    raise ModelError(f"unknown plan {name!r}; plans and baselines (closest first): "
                     f"{closest(name, [*PLANS, *BASELINES])}")


def make_arm(model: Model, given: Plan | str | Arm, dtype: str, max_len: int) -> Arm:
    """The arm of a plan, a plan's or a baseline's name, or an arm as it is."""
    if isinstance(given, str) and is_baseline(given):
        from models.baseline_hf import baseline, hf_arm

        return hf_arm(baseline(given), model.path, max_len)
    if isinstance(given, (Plan, str)):
        return PlanArm(model, builtin_plan(given) if isinstance(given, str) else given, dtype,
                       max_len)
    return given


def evaluate(model: Model, plans: list[Plan | str | Arm], dtype: str,
             tokens: dict[str, np.ndarray], speed: bool = False, ceiling=None,
             max_mean_kld: float = 1e-4, min_same_top: float = 0.99, prefill: int = 0,
             compare: bool = True, batch: int = 0, progress: Progress | None = None
             ) -> list[dict]:
    """One row per (arm, text) (the `model` table's columns, run id left to the caller); the
    reference logits computed once per text. `plans`: plans, their names or baselines' names
    (`make_arm`). With `speed`, `ceiling(backend name)` gives the copy ceiling in GB/s for the
    roofline (None: no roofline), `prefill` > 0 times a prefill pass over a prompt of that
    many tokens (`prompt_tokens`) and `batch` > 1 a decode of that many sequences at once
    (each as long as the text, cut from the same prompt tokens). `compare=False` (speed only:
    a model too large for the float64 reference, e.g. synthetic:llama3-8b) skips the
    reference and the logits: the rows carry the speed, no statistics, gate `report`.
    `progress`: told the stages up front (estimated where it asks, `step_seconds`) and each
    stage's tokens as they go (`Progress`)."""
    progress = progress or Progress()
    longest = max(len(t) for t in tokens.values())
    max_len = max(longest, prefill if speed else 0)
    ref_dec = Decoder(model.weights, "reference", dtype, max_len=longest) if compare else None
    arms = [make_arm(model, p, dtype, max_len) for p in plans]
    prompt = prompt_tokens(model, prefill) if speed and prefill else None
    batched = prompt_tokens(model, batch * longest).reshape(batch, longest) \
        if speed and batch > 1 else None
    step, done = {}, {}  # done: text -> (reference logits, seconds), computed for the estimate
    if progress.estimate:
        text, first = next(iter(tokens.items()))
        step = {arm.name: step_seconds(arm, first) for arm in arms}
        if compare:
            start = time.perf_counter()
            done[text] = (reference_logits(ref_dec, first), time.perf_counter() - start)
            step["reference"] = done[text][1] / len(first)  # a prefill pass: per token
    stages = plan_stages(arms, tokens, compare, speed, prompt, batched, step)
    progress.plan(stages, ", ".join(dict.fromkeys(arm.device for arm in arms)))
    running = _Running(progress, stages)
    rows = []
    for text, ids in tokens.items():
        ref, ref_seconds = done.pop(text, (None, 0.0))
        if compare and ref is None:
            start = time.perf_counter()
            with running.stage(text, "reference", "logits", ref_dec):
                ref = reference_logits(ref_dec, ids)
            ref_seconds = time.perf_counter() - start
        for arm in arms:
            rows.append(_row(model, arm, text, ids, ref, speed, ceiling, max_mean_kld,
                             min_same_top, ref_seconds, prompt,
                             None if batched is None else batched[:, :len(ids)], running))
    return rows


# --- progress ----------------------------------------------------------------------------------

PREFILL_PASSES = 6  # `time_prefill`'s warm-up pass and its 5 repeats


@dataclass(frozen=True)
class Stage:
    """One pass of `evaluate` over a text: `who` (the reference or an arm) runs `what`
    ("logits", "decode", "eager", "prefill", "batch N"), `tokens` tokens in all, in about
    `seconds` (None: not estimated)."""

    text: str
    who: str
    what: str
    tokens: int
    seconds: float | None = None

    @property
    def label(self) -> str:
        return f"{self.text}: {self.who} {self.what}"


class Progress:
    """What `evaluate` says as it runs; this one says nothing (the CLI draws bars,
    `verbs/model.py`). `estimate`: time a few decode steps of the reference and of each arm
    before the first stage (`step_seconds`), so that the stages carry their seconds; `plan`:
    every stage, once, before the first, and the arms' devices; `start`: a stage begins,
    returning what its decoder calls with each step's or pass's token count."""

    estimate = False

    def plan(self, stages: list[Stage], device: str) -> None:
        pass

    def start(self, stage: Stage):
        return None


def step_seconds(who, ids: np.ndarray) -> float | None:
    """Seconds one decode step of `who` (a `Decoder` or an arm) takes, for the estimate: the
    median of the steps at positions 2 and 3 (the first ones carry one-time work: the
    reference's dequantized weights, a compile); None where `ids` has fewer than 4 tokens."""
    if len(ids) < 4:
        return None
    dec = who if isinstance(who, Decoder) else getattr(who, "decoder", None)
    timing = time_decode(dec, ids[:4], warmup=2) if dec is not None else \
        who.time(ids[:4], warmup=2)
    return timing.ms_per_token / 1e3


def plan_stages(arms: list[Arm], tokens: dict[str, np.ndarray], compare: bool, speed: bool,
                prompt: np.ndarray | None, batched: np.ndarray | None,
                step: dict[str, float | None]) -> list[Stage]:
    """Every stage `evaluate` runs, in order; a stage's seconds are its decode steps times
    `step[who]` (`step_seconds`) where known. A prefill pass is not estimated; a batch's step
    is taken as a single sequence's (a GEMV's weights read once for all rows)."""
    out = []

    def add(text, who, what, n_tokens, steps=None):
        s = step.get(who)
        out.append(Stage(text, who, what, n_tokens,
                         None if s is None or steps is None else s * steps))

    for text, ids in tokens.items():
        n = len(ids)
        if compare:
            add(text, "reference", "logits", n, n)
        for arm in arms:
            if compare:
                add(text, arm.name, "logits", n, n)
            if not speed:
                continue
            add(text, arm.name, "decode", n, n)
            if getattr(getattr(arm, "decoder", None), "graph", False):
                add(text, arm.name, "eager", n, n)
            if prompt is not None:
                add(text, arm.name, "prefill", PREFILL_PASSES * len(prompt))
            if batched is not None:
                add(text, arm.name, f"batch {len(batched)}", n * len(batched), n)
    return out


class _Running:
    """`evaluate`'s stages by (text, who, what), each started as it runs."""

    def __init__(self, progress: Progress, stages: list[Stage]):
        self.progress = progress
        self.stages = {(s.text, s.who, s.what): s for s in stages}

    @contextmanager
    def stage(self, text: str, who: str, what: str, target):
        """Stage (text, who, what) running: `target` (a `Decoder` or an arm) tells the
        progress its tokens through its `on_tokens` (a stage not planned: nothing)."""
        stage = self.stages.get((text, who, what))
        target.on_tokens = None if stage is None else self.progress.start(stage)
        try:
            yield
        finally:
            target.on_tokens = None


def reference_logits(ref_dec: Decoder, ids: np.ndarray) -> np.ndarray:
    """The reference plan's logits over `ids` in one prefill pass: the composition of its
    decode steps (qmm's oracle is dequant_gemv's per row, the prefill attention's the
    decode's per query), each weight read once per text instead of once per token (a SmolLM2
    text of 64 tokens: 4 s instead of 60 s on a loaded 2-core CPU). The float64 products run
    in another BLAS order; the logits, rounded to T at every op as the steps' are, came out
    the same bits (tests/test_model_decode.py; SmolLM2's texts)."""
    return ref_dec.logits(ids, prefill=len(ids))


def prompt_tokens(model: Model, n: int) -> np.ndarray:
    """A prompt of n tokens for the prefill timing: every evaluation text's tokens, one after
    the other, repeated to length n (a synthetic model: random ids from its seed)."""
    if model.tokenizer is None:
        return np.random.default_rng(model.seed + 1).integers(0, model.weights.config.vocab, n)
    from models.texts import load_texts

    texts = load_texts()
    ids = np.concatenate([model.tokenizer.encode(texts[k]) for k in sorted(texts)])
    return np.resize(ids, n)


def verdict(arm: Arm, summary: dict, max_mean_kld: float = 1e-4,
            min_same_top: float = 0.99, failed_flips=(), near_ties: int = 0
            ) -> tuple[str, list[str]]:
    """(gate, reasons) of an arm's summary: pass or fail by `metrics.gate` (flips within
    `metrics.margin_bound` are near ties, counted as agreeing; `failed_flips`, the others,
    fail), `report` for an arm that is not gated (the reference, a plan with a report-only
    impl, a baseline), its notes first."""
    ok, reasons = metrics.gate(summary, failed_flips, max_mean_kld, min_same_top, near_ties)
    gate = ("pass" if ok else "fail") if arm.gated else "report"
    return gate, [*arm.notes, *reasons]


def judge(arm: Arm, ref: np.ndarray, test: np.ndarray, ids: np.ndarray,
          max_mean_kld: float = 1e-4, min_same_top: float = 0.99):
    """An arm's teacher-forced logits `test` against the reference's `ref` (row i: after token
    i, scored against token i + 1): (summary, the failed flips' positions, the near ties'
    positions, gate, reasons); flips judged against `metrics.margin_bound`."""
    m = metrics.position_metrics(ref[:-1], test[:-1], ids[1:])
    s = metrics.summary(m)
    bound = metrics.margin_bound(max_mean_kld)
    flipped, ties = metrics.flips(m, bound), metrics.near_ties(m, bound)
    gate, reasons = verdict(arm, s, max_mean_kld, min_same_top, flipped, len(ties))
    return s, flipped, ties, gate, reasons


def _row(model: Model, arm: Arm, text: str, ids: np.ndarray, ref: np.ndarray | None,
         speed: bool, ceiling, max_mean_kld: float, min_same_top: float, ref_seconds: float,
         prompt: np.ndarray | None = None, batched: np.ndarray | None = None,
         running: _Running | None = None) -> dict:
    running = running or _Running(Progress(), [])
    start = time.perf_counter()
    row = {"model": model.name, "model_sha256": model.sha256, "plan": arm.name,
           "plan_json": json.dumps(arm.describe(), sort_keys=True),
           "backend": arm.backend, "device": arm.device, "dtype": arm.dtype, "text": text,
           **dict.fromkeys(SPEED_FIELDS)}
    if ref is None:  # speed only
        row.update({"positions": 0, "flips": 0, "near_ties": 0, "gate": "report",
                    "gate_reasons": "speed only: not compared with the reference",
                    "summary_json": "{}", **dict.fromkeys(STATISTICS)})
    else:
        with running.stage(text, arm.name, "logits", arm):
            logits = arm.logits(ids)
        s, flipped, ties, gate, reasons = judge(arm, ref, logits, ids, max_mean_kld,
                                                min_same_top)
        row.update({"positions": int(s["n"]), **{k: _num(s.get(k)) for k in STATISTICS},
                    "flips": int(len(flipped)), "near_ties": int(len(ties)), "gate": gate,
                    "gate_reasons": "; ".join(reasons),
                    "summary_json": json.dumps(s, sort_keys=True, default=_num)})
    if speed:
        row.update(speed_row(arm, ids, ceiling, prompt, batched, running, text))
    row["seconds"] = time.perf_counter() - start + ref_seconds
    return row


STATISTICS = ("mean_kld", "mean_kld_unc", "median_kld", "kld_90", "kld_95", "kld_99",
              "kld_99_9", "max_kld", "same_top_p", "same_top_p_unc", "rms_dp", "rms_dp_unc")
SPEED_FIELDS = ("prefill_tok_s", "prefill_tokens", "decode_tok_s", "decode_mode", "eager_tok_s",
                "ms_per_token", "ms_per_token_spread", "roofline_tok_s", "batch_size",
                "batch_tok_s")


def speed_row(arm: Arm, ids: np.ndarray, ceiling=None, prompt: np.ndarray | None = None,
              batched: np.ndarray | None = None, running: _Running | None = None,
              text: str = "") -> dict:
    """The speed fields of an arm's row (`SPEED_FIELDS`): its decode over `ids` at batch 1 (a
    CUDA graph where the arm replays one, `decode_mode`; then the eager step's tokens/s
    beside it), the roofline at the text's middle position over `ceiling(backend)` GB/s, and
    the prefill pass over `prompt` and a decode of the sequences `batched` [batch, T] at once
    (None: not timed). `running`: `evaluate`'s stages, of text `text`."""
    running = running or _Running(Progress(), [])
    with running.stage(text, arm.name, "decode", arm):
        timing = arm.time(ids)
    with running.stage(text, arm.name, "eager", arm):
        eager = arm.time_eager(ids)
    row = {"decode_tok_s": timing.tokens_per_s, "ms_per_token": timing.ms_per_token,
           "ms_per_token_spread": (timing.p90_ms - timing.p10_ms) / timing.ms_per_token,
           "decode_mode": "eager" if eager is None else "graph",
           "eager_tok_s": (eager or timing).tokens_per_s}
    if ceiling and arm.timed_backend:  # the reference's oracles run untimed
        row["roofline_tok_s"] = ceiling(arm.timed_backend) * 1e9 / arm.step_bytes(len(ids) // 2)
    if prompt is not None:
        with running.stage(text, arm.name, "prefill", arm):
            pre = arm.time_prefill(prompt)
        if pre is not None:
            row.update(prefill_tok_s=pre.tokens_per_s, prefill_tokens=pre.tokens)
    if batched is not None:
        with running.stage(text, arm.name, f"batch {len(batched)}", arm):
            many = arm.time_batch(batched)
        if many is not None:
            row.update(batch_size=many.batch, batch_tok_s=many.tokens_per_s)
    return row


def _num(v):
    """A summary value as a plain float (None for NaN: the table's null)."""
    if v is None:
        return None
    v = float(v)
    return None if np.isnan(v) else v
