"""`kparity check`'s verdicts cannot mislead: only launched checks count as checks, refusals
and report-only impls are shown apart, ULPs only where they describe the budget's element,
budgets never read as 1 unless they are 1. Rows are built directly: no sweep runs."""

from __future__ import annotations

import json

import numpy as np

import gpu_impls
from cases.generate import Work
from cases.model import Case
from oracle.metrics import budget_text, compare
from results.store import Store
from runners.rows import base_row
from verbs.check import summarize

CASE = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="preset:x")


def _row(impl: str, status: str, expect: str = "valid", metrics: dict | None = None) -> dict:
    row = base_row(Work(gpu_impls.impls()[impl], CASE, expect), "cpu", "run1")
    row["status"] = status
    if metrics is not None:
        row.update({k: metrics[k] for k in ("max_ulp", "budget")}, worst_output="out",
                   outputs_json=json.dumps({"out": metrics}))
    return row


def _near_zero_metrics(budget: float) -> dict:
    """An output whose worst-budget element is 1 ULP off at 1.0, beside an element near zero
    that crosses it (a billion ULPs apart, well within its bound)."""
    one_up = float(np.nextafter(np.float32(1), np.float32(2)))
    out = np.array([one_up, -1e-9], np.float32)
    ref = np.array([1.0, 1e-9], np.float32)
    bound = np.array([(one_up - 1.0) / budget, 1e-6])
    return compare(out, ref, ref.astype(np.float64), bound, "f32")


def test_only_launched_checks_count_refusals_and_report_only_impls_apart(tmp_path, capsys):
    ok = _near_zero_metrics(0.5)
    rows = [_row("torch:rms_norm", "pass", metrics=ok), _row("torch:rms_norm", "pass", metrics=ok),
            _row("torch:rms_norm", "rejected", "rejected"),
            *(_row("torch:linear_dense", "rejected", "rejected") for _ in range(3))]
    summarize(rows, "run1", Store(tmp_path))
    out = capsys.readouterr().out
    assert ("OK: 2 checks launched, 0 failing; 4 violating cases refused by contract, as "
            "expected; 1 report-only impl (not gated)") in out
    gate, report_only = out.split("report-only impls (speed baselines, not gated)")
    assert "torch:linear_dense" not in gate and "torch:linear_dense" in report_only
    assert "W is rounded to T once dequantized" in report_only  # why it does not gate
    header = next(line for line in report_only.splitlines() if "impl" in line)
    assert "pass" not in header and "rejected ok" in header  # no gate columns of zeros


def test_ulps_only_at_the_budgets_element_and_budgets_keep_their_side_of_1(tmp_path, capsys):
    near_one = _near_zero_metrics(0.9996)
    assert near_one["max_ulp"] > 10**9 and near_one["worst_ulp"] == 1  # the stored max: as was
    assert abs(near_one["budget"] - 0.9996) < 1e-9
    unwritten = compare(np.full(4, np.nan, np.float32), np.ones(4, np.float32), np.ones(4),
                        np.full(4, 1e-7), "f32")  # poison left: nothing written
    assert unwritten["budget"] == np.inf and unwritten["worst_ulp"] is None
    rows = [_row("torch:rms_norm", "pass", metrics=near_one),
            _row("torch:rms_norm_llama", "fail", metrics=unwritten)]
    summarize(rows, "run1", Store(tmp_path))
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "torch:rms_norm " in line)
    assert [c.strip() for c in line.split("│")[-3:-1]] == ["0.999 / 0.999 / 0.999", "1"]
    assert str(near_one["max_ulp"]) not in out
    line = next(line for line in out.splitlines() if "torch:rms_norm_llama" in line)
    assert [c.strip() for c in line.split("│")[-3:-1]] == ["inf / inf / inf", "-"]


def test_budget_text_never_rounds_onto_1():
    assert [budget_text(b) for b in (0.9996, 0.99, 1.0, 1.0004, 2.75, 0.000313051, 0.0,
                                      float("inf"), None)] == \
        ["0.999", "0.99", "1", "1.01", "2.75", "0.000313", "0", "inf", "-"]


def test_repro_describes_a_staged_impls_stage_outputs():
    """A staged pipeline impl's row holds "<stage>.<output>" metrics: `repro` words them as the
    stage's op does (it raised StopIteration on them). A stand-in pipeline spec: registering the
    example plugin here would change what later tests of this process see."""
    from types import SimpleNamespace

    from oracle.spec import get_op
    from oracle.comparators import describe

    stage = SimpleNamespace(name="norm", spec=get_op("rms_norm"))
    pipeline_op = SimpleNamespace(name="norm_scale", outputs=get_op("rms_norm").outputs,
                                  pipeline=SimpleNamespace(stages=[stage]))
    assert describe(pipeline_op, "norm.out", _near_zero_metrics(0.5)).startswith(
        "budget 0.5, max_abs 1.19e-07, ulp at worst 1,")
