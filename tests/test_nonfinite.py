"""The `nonfinite` distribution: NaN, +inf and -inf planted in rows 0/1/2 (mod 4), row 3 clean; the
oracle's IEEE propagation is the contract (`oracle/norms.py`). Real impls pass it; a kernel that
reads non-finite values as 0 fails on those cases and nowhere else."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cases.model import Case, make_inputs
from results.store import Store
from verbs.cli import main

MUTANTS = str(Path(__file__).with_name("mutants.py"))


def test_planted_values_and_the_oracle_propagation():
    case = Case.make("rms_norm", {"rows": 7, "n": 64}, "f32", "nonfinite",
                     params={"eps": 1e-6, "weight_offset": 0})
    x = make_inputs(case)["x"].astype(np.float64)
    assert np.isnan(x).sum(axis=1).tolist() == [1, 0, 0, 0, 1, 0, 0]
    assert (x == np.inf).sum(axis=1).tolist() == [0, 1, 0, 0, 0, 1, 0]
    assert (x == -np.inf).sum(axis=1).tolist() == [0, 0, 1, 0, 0, 0, 1]
    exact, _ = case.spec.reference(make_inputs(case), case)
    out = exact["out"]
    assert np.isnan(out[0]).all() and np.isnan(out[4]).all()  # a NaN row is NaN throughout
    for r in (1, 2, 5, 6):  # inf rows: rsqrt(inf) = 0, finite elements 0, the inf one NaN
        assert np.isnan(out[r]).sum() == 1 and np.isnan(out[r][np.isinf(x[r])]).all()
        assert (out[r][np.isfinite(x[r])] == 0).all()
    assert np.isfinite(out[3]).all() and np.abs(out[3]).max() > 0.5


def test_real_impl_passes_and_a_sanitising_kernel_fails_only_there(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "--plugin", MUTANTS, "check", "--impl",
               "torch:rms_norm,torch:mutant_zero_nonfinite", "--preset", "qwen3-0.6b",
               "--valid-only", "--isolate", "none"])
    assert rc == 1
    rows = Store(tmp_path).read("correctness").to_pylist()
    failing = {(r["impl"], r["dist"]) for r in rows if r["status"] != "pass"}
    assert failing == {("torch:mutant_zero_nonfinite", "nonfinite")}
    assert {r["dtype"] for r in rows if r["status"] != "pass"} == {"f32", "f16", "bf16"}
    assert all(r["nonfinite_mismatch"] > 0 for r in rows if r["status"] != "pass")
    assert sum(r["dist"] == "nonfinite" for r in rows) == 6
    assert "fail, by kind: 3 NaN/Inf mismatch" in capsys.readouterr().out
