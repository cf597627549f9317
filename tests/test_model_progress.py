"""`evaluate`'s progress (`models.gate.Progress`, drawn by `verbs.model.Bars`): every stage it
runs is planned up front, in order, estimated where asked, and reports its tokens as it goes;
the reference's logits come from one prefill pass, the bits of its decode steps."""

from __future__ import annotations

import numpy as np
import pytest

from models.decode import Decoder
from models.gate import Model, Progress, evaluate, reference_logits
from models.synthetic import config, random_weights

IDS = np.random.default_rng(3).integers(0, 256, 8)


@pytest.fixture(scope="module")
def model():
    return Model("synthetic:tiny", random_weights(config("tiny"), seed=0), None, "")


class Recorder(Progress):
    def __init__(self, estimate: bool):
        self.estimate = estimate
        self.planned, self.started, self.tokens = [], [], {}

    def plan(self, stages, device):
        self.planned = list(stages)

    def start(self, stage):
        self.started.append(stage)
        self.tokens[stage] = 0

        def done(n):
            self.tokens[stage] += n
        return done


@pytest.mark.parametrize("estimate", [False, True])
def test_every_stage_is_planned_and_reports_its_tokens(model, estimate):
    progress = Recorder(estimate)
    texts = {"a": IDS, "b": IDS[:6]}
    rows = evaluate(model, ["torch"], "f32", texts, speed=True, prefill=5, batch=2,
                    progress=progress)
    assert len(rows) == 2
    what = [(s.text, s.who, s.what) for s in progress.planned]
    assert what == [(t, who, w) for t in "ab" for who, w in (
        ("reference", "logits"), ("torch", "logits"), ("torch", "decode"),
        ("torch", "prefill"), ("torch", "batch 2"))]
    # with an estimate, the first text's reference ran before the plan (to time it)
    skipped = [progress.planned[0]] if estimate else []
    assert progress.started == [s for s in progress.planned if s not in skipped]
    assert all(progress.tokens[s] == s.tokens for s in progress.started)
    seconds = [s.seconds for s in progress.planned if s.what != "prefill"]
    assert all(x is not None and x > 0 for x in seconds) if estimate else \
        all(x is None for x in seconds)


def test_the_reference_prefill_is_its_decode_steps(model):
    ref = Decoder(model.weights, "reference", "f16", max_len=8)
    assert np.array_equal(reference_logits(ref, IDS), ref.logits(IDS))


def test_the_cli_says_up_front_when_a_run_takes_minutes(capsys):
    from models.gate import Stage
    from verbs.model import Bars

    stages = [Stage("a", "reference", "logits", 64, 30.0), Stage("a", "torch", "logits", 64, 90.0),
              Stage("a", "torch", "prefill", 3072)]
    bars = Bars("smollm2", every=0.0)
    bars.plan(stages, "cpu")
    out = capsys.readouterr().out
    assert "estimate: about 2.0 min on cpu (reference 0.5, torch 1.5 min + the prefill passes)" \
        in out
    tick = bars.start(stages[1])
    tick(32)
    assert bars.done == pytest.approx(30.0 + 45.0)
    assert "now a: torch logits, 32/64 tokens" in capsys.readouterr().out  # no terminal here
    Bars("tiny").plan(stages[:1], "cpu")
    assert "estimate" not in capsys.readouterr().out  # under a minute: nothing said
