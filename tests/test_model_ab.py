"""`kparity model-ab` (issue 28, `models/ab.py`, `verbs/model_ab.py`): the model-level A/B of one
kernel lever on the tiny synthetic model (torch CPU). Timings on a shared CPU are noise, so the
tests assert the row's structure and the statistics' consistency, never a verdict; a wrong GEMV
in B fails the A/B untimed; bad input is exit 2."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from models.ab import parse_plan
from models.plan import ModelError, plan
from runners.abstats import threshold, verdict
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))
EXACT = "torch+kv_update=torch:static_cache_index_copy"  # the same bits, another kernel
WRONG = "torch+dequant_gemv=torch:mutant_gemv_group_off_by_one"
TINY = ["--model", "synthetic:tiny", "--dtype", "f16", "--tokens", "5", "--warmup", "1"]


def _rows(store: Path, table: str) -> list[dict]:
    return ds.dataset(store / table, format="parquet").to_table().to_pylist()


def test_an_exact_swap_is_timed_and_its_statistics_hold_together(tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["--store", str(store), "model-ab", "torch", EXACT, *TINY]) == 0
    out = capsys.readouterr().out
    (row,) = _rows(store, "ab")
    assert (row["op"], row["impl_a"], row["impl_b"], row["mode"], row["label"]) == \
        ("model", "torch", EXACT, "decode", "random-0")
    dims = json.loads(row["dims"])
    assert dims["model"] == "synthetic:tiny" and dims["tokens"] == 5 and dims["layers"] >= 1
    assert row["status"] == "ok" and (row["correct_a"], row["correct_b"]) == ("pass", "pass")
    assert row["ab_max_abs"] == 0 and row["ab_max_ulp"] == 0  # bit-identical logits
    assert "mean KLD" in row["message"]
    a, b = row["runs_a_ns"], row["runs_b_ns"]
    assert len(a) == len(b) == 5 and min(a + b) > 0
    assert row["ratio"] == pytest.approx(statistics.median(b) / statistics.median(a))
    assert row["ci_lo"] <= row["ratio"] <= row["ci_hi"]
    assert row["delta"] == pytest.approx(threshold(row["aa_noise"]))
    assert row["verdict"] == verdict(row["ratio"], row["ci_lo"], row["ci_hi"], row["delta"])
    (run,) = _rows(store, "runs")
    assert run["verb"] == "model-ab" and run["run_id"] == row["run_id"]
    assert row["verdict"] in out and "A mean KLD" in out


def test_a_wrong_gemv_in_b_fails_the_ab_untimed(tmp_path, capsys):
    store = tmp_path / "store"
    rc = main(["--store", str(store), "--plugin", MUTANTS, "model-ab", "torch", WRONG, *TINY])
    out = capsys.readouterr().out
    assert rc == 1 and "repro: kparity" in out and f"model-ab torch {WRONG}" in out
    (row,) = _rows(store, "ab")
    assert row["status"] == "fail" and (row["correct_a"], row["correct_b"]) == ("pass", "fail")
    assert "not timed" in row["message"] and "mean KLD" in row["message"]
    assert row["runs_a_ns"] == row["runs_b_ns"] == [] and row["verdict"] is None
    assert row["ab_max_ulp"] > 0


@pytest.mark.parametrize("argv", [
    ["torch", "torch+dequant_gemv"],            # a swap without its impl
    ["torch", "trch"],                          # an unknown plan
    ["torch", "torch+rms_norm=torch:nope"],     # an unknown impl
    ["torch", "torch", "--runs", "3"],          # too few runs for a verdict
    ["torch", "torch", "--warmup", "8"],        # no step left to time
    ["torch", "torch", "--model", "synthetic:huge"],
])
def test_bad_input_is_refused_by_name(tmp_path, argv, capsys):
    assert main(["--store", str(tmp_path / "s"), "model-ab", *TINY, *argv]) == 2
    assert "error:" in capsys.readouterr().out


def test_a_swapped_plans_name_reads_back_as_that_plan():
    swapped = plan("cuda").swapped({"rms_norm": "torch:rms_norm",
                                    "kv_update": "torch:static_cache_index_copy"})
    assert parse_plan(swapped.name) == swapped
    assert parse_plan("torch") == plan("torch")
    with pytest.raises(ModelError, match="swapped twice"):
        parse_plan("torch+rms_norm=torch:rms_norm+rms_norm=torch:rms_norm")
