"""`kparity check`'s summary columns tell impls apart (issue 49, item 6): the budget as
p50 / p99 / max over an impl's judged rows, and ULPs at the worst element only where its |exact|
is above its bound (a bound reaching zero admits every value near zero: a ULP count there is
huge and says nothing). Rows are built directly: no sweep runs."""

from __future__ import annotations

import json

import numpy as np

import gpu_impls
from cases.generate import Work
from cases.model import Case
from oracle.metrics import compare
from results.store import Store
from runners.rows import base_row
from verbs.check import BUDGET_COLUMN, summarize

CASE = Case.make("rms_norm", {"rows": 2, "n": 64}, "f32", label="preset:x")


def _row(impl: str, metrics: dict, status: str = "pass") -> dict:
    row = base_row(Work(gpu_impls.impls()[impl], CASE, "valid"), "cpu", "run1")
    row.update({k: metrics.get(k) for k in ("max_ulp", "budget")}, status=status,
               worst_output="out", outputs_json=json.dumps({"out": metrics}))
    return row


def _budget_row(impl: str, budget: float) -> dict:
    """A row whose output is 1 ULP off at 1.0 with that budget."""
    one_up = float(np.nextafter(np.float32(1), np.float32(2)))
    ref = np.ones(1, np.float32)
    metrics = compare(np.array([one_up], np.float32), ref, ref.astype(np.float64),
                      np.array([(one_up - 1.0) / budget]), "f32")
    metrics["budget"] = budget  # as given, not as err / (err / budget) rounds
    return _row(impl, metrics, "pass" if budget <= 1 else "fail")


def _cells(out: str, impl: str) -> dict[str, str]:
    """The impl's summary row as {column: cell}."""
    header = next(line for line in out.splitlines() if "┃ impl" in line)
    line = next(line for line in out.splitlines() if f"│ {impl} " in line)
    names = [c.strip() for c in header.split("┃")[1:-1]]
    return dict(zip(names, (c.strip() for c in line.split("│")[1:-1])))


def test_budget_column_is_p50_p99_max_over_the_judged_rows(tmp_path, capsys):
    rows = [*(_budget_row("torch:rms_norm", b) for b in (0.9, 0.1, 0.2)),
            # 200 rows: p99 is the 198th smallest, not the one outlier
            *(_budget_row("torch:rms_norm_llama", (i + 1) / 1000) for i in range(199)),
            _budget_row("torch:rms_norm_llama", 5.0),
            # never 1 unless 1: 0.9996 reads 0.999 everywhere, 1 itself reads 1
            *(_budget_row("torch:example_rms_norm", b) for b in (0.9996, 0.9996, 1.0))]
    summarize(rows, "run1", Store(tmp_path))
    out = capsys.readouterr().out
    assert "max budget" not in out
    assert _cells(out, "torch:rms_norm")[BUDGET_COLUMN] == "0.2 / 0.9 / 0.9"
    assert _cells(out, "torch:rms_norm_llama")[BUDGET_COLUMN] == "0.1 / 0.198 / 5"
    assert _cells(out, "torch:example_rms_norm")[BUDGET_COLUMN] == "0.999 / 1 / 1"
    assert all(len(line) <= 150 for line in out.splitlines())


def test_rows_not_judged_do_not_enter_the_budget(tmp_path, capsys):
    error = base_row(Work(gpu_impls.impls()["torch:rms_norm"], CASE, "valid"), "cpu", "run1")
    rows = [_budget_row("torch:rms_norm", 0.3), error,
            base_row(Work(gpu_impls.impls()["torch:rms_norm_llama"], CASE, "valid"), "cpu",
                     "run1")]
    summarize(rows, "run1", Store(tmp_path))
    out = capsys.readouterr().out
    assert _cells(out, "torch:rms_norm")[BUDGET_COLUMN] == "0.3 / 0.3 / 0.3"
    assert _cells(out, "torch:rms_norm_llama")[BUDGET_COLUMN] == "-"


def test_no_huge_ulp_at_a_worst_element_near_zero_below_its_bound(tmp_path, capsys):
    # the worst element crosses zero inside its bound (1e-6 reaches past 0): billions of ULPs
    ref = np.array([1e-9, 1.0], np.float32)
    near_zero = compare(np.array([-1e-9, 1.0], np.float32), ref, ref.astype(np.float64),
                        np.array([1e-6, 1e-7]), "f32")
    assert near_zero["worst_index"] == 0 and near_zero["worst_ulp"] > 10**9
    assert near_zero["budget"] < 1
    # the same ULP count where |exact| is above the bound is shown: it describes the error
    one_up = float(np.nextafter(np.float32(1), np.float32(2)))
    above = compare(np.array([one_up], np.float32), np.ones(1, np.float32), np.ones(1),
                    np.array([2 * (one_up - 1.0)]), "f32")
    assert above["worst_ulp"] == 1
    rows = [_row("torch:rms_norm", near_zero), _row("torch:rms_norm_llama", above)]
    summarize(rows, "run1", Store(tmp_path))
    out = capsys.readouterr().out
    assert _cells(out, "torch:rms_norm")["ulp @ worst"] == "-"
    assert str(near_zero["worst_ulp"]) not in out and str(near_zero["max_ulp"]) not in out
    assert _cells(out, "torch:rms_norm_llama")["ulp @ worst"] == "1"


def test_ulp_at_worst_is_taken_at_the_largest_budgets_row(tmp_path, capsys):
    """Where the largest budget's element is above its bound the ULPs there show, not those of
    another row."""
    ref = np.array([1.0], np.float32)
    three_up = float(np.nextafter(np.nextafter(np.nextafter(
        np.float32(1), np.float32(2)), np.float32(2)), np.float32(2)))
    worst = compare(np.array([three_up], np.float32), ref, ref.astype(np.float64),
                    np.array([(three_up - 1.0) / 0.8]), "f32")
    assert worst["worst_ulp"] == 3 and abs(worst["budget"] - 0.8) < 1e-9
    worst["budget"] = 0.8
    rows = [_budget_row("torch:rms_norm", 0.5), _row("torch:rms_norm", worst),
            _budget_row("torch:rms_norm", 0.1)]
    summarize(rows, "run1", Store(tmp_path))
    cells = _cells(capsys.readouterr().out, "torch:rms_norm")
    assert cells[BUDGET_COLUMN] == "0.5 / 0.8 / 0.8" and cells["ulp @ worst"] == "3"
