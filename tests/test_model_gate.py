"""`kparity model` (issue 28, `models/gate.py`, `verbs/model.py`): the reference plan against the
torch and MLX CPU plans, a planted wrong GEMV swapped in failing the gate by orders of magnitude
in mean KLD, the rows of the `model` table, and bad input refused; the real SmolLM2-135M Q4_1
model on a short text."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest

from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))
TINY = ["model", "--model", "synthetic:tiny", "--dtype", "f16", "--tokens", "16"]


def _rows(store: Path) -> list[dict]:
    return ds.dataset(store / "model", format="parquet").to_table().to_pylist()


def test_cpu_plans_pass_and_a_wrong_gemv_fails_by_orders_of_magnitude(tmp_path, capsys):
    store = tmp_path / "store"
    assert main(["--store", str(store), *TINY, "--plan", "torch,mlx"]) == 0
    clean = {r["plan"]: r for r in _rows(store)}
    assert set(clean) == {"torch", "mlx"} and clean["torch"]["gate"] == "pass"
    assert all(0 <= r["mean_kld"] < 1e-4 and r["positions"] == 15 for r in clean.values())
    # MLX's half-precision quantized matmul is report-only (another function): not gated
    assert clean["mlx"]["gate"] == "report" and "mlx:quantized_matmul_half" in \
        clean["mlx"]["gate_reasons"]

    bad = tmp_path / "bad"
    rc = main(["--store", str(bad), "--plugin", MUTANTS, *TINY, "--plan", "torch", "--swap",
               "dequant_gemv=torch:mutant_gemv_group_off_by_one"])
    out = capsys.readouterr().out
    assert rc == 1 and "repro: kparity" in out and "--swap" in out
    (row,) = _rows(bad)
    assert row["gate"] == "fail" and row["mean_kld"] > 100 * clean["torch"]["mean_kld"]


@pytest.mark.parametrize("argv", [["--plan", "nope"], ["--swap", "foo"], ["--tokens", "1"],
                                  ["--model", "synthetic:huge"]])
def test_bad_input_is_refused_by_name(tmp_path, argv, capsys):
    assert main(["--store", str(tmp_path / "s"), *TINY, *argv]) == 2
    assert "error:" in capsys.readouterr().out


def test_a_plan_whose_backend_is_missing_exits_3(tmp_path, capsys):
    import gpu_impls

    if gpu_impls.backend("cuda").available()[0]:
        pytest.skip("CUDA is here")
    assert main(["--store", str(tmp_path / "s"), *TINY, "--plan", "cuda"]) == 3
    assert "cuda:kp_rms_norm is not available here" in capsys.readouterr().out


# nightly: the real model (21 s on a 2-core CPU); the tiny model's tests cover the plan
@pytest.mark.nightly
def test_smollm2_torch_plan_passes_on_a_short_text(tmp_path):
    """The real model (the MLX plan runs ~3 s a token on this CPU: the tiny model covers it)."""
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    store = tmp_path / "store"
    assert main(["--store", str(store), "model", "--plan", "torch", "--dtype", "f16",
                 "--tokens", "8", "--text", "lincoln_gettysburg"]) == 0
    (row,) = _rows(store)
    assert row["model_sha256"] and row["positions"] == 7 and row["gate"] == "pass"
    assert row["mean_kld"] < 1e-4


def test_speed_fields_of_a_row(tmp_path):
    """--speed: batch 1 (eager on the CPU), a batch of 2 and a 16-token prefill, each timed;
    --speed-only: no reference, no statistics, gate `report`."""
    store = tmp_path / "store"
    assert main(["--store", str(store), *TINY, "--plan", "torch", "--speed", "--prefill", "16",
                 "--batch", "2"]) == 0
    (row,) = _rows(store)
    assert row["decode_mode"] == "eager" and row["eager_tok_s"] == row["decode_tok_s"] > 0
    assert row["batch_size"] == 2 and row["batch_tok_s"] > 0 and row["prefill_tokens"] == 16
    assert row["prefill_tok_s"] > 0 and row["roofline_tok_s"] > 0
    only = tmp_path / "only"
    assert main(["--store", str(only), *TINY, "--plan", "torch", "--speed-only", "--prefill",
                 "0", "--batch", "0"]) == 0
    (row,) = _rows(only)
    assert row["gate"] == "report" and row["mean_kld"] is None and row["decode_tok_s"] > 0
    assert row["prefill_tok_s"] is None and row["batch_tok_s"] is None
    assert main(["--store", str(only), *TINY, "--speed", "--batch", "1"]) == 2
