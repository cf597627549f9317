"""The bite audit (`kparity bite`, runners/bite.py): planted generic mistakes in a correct impl.

On rms_norm f32 (torch:rms_norm, 43 commit-tier cases, a few seconds) the gate catches a zeroed
row, two swapped rows and outputs scaled by 1 + 16 eps; a mistake that changes nothing passes
every case and fails the audit (exit 1); the exit code follows the uncaught list.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from oracle.dtypes import ulp_distance
from runners import bite
from verbs.cli import main

ARGS = ["bite", "--op", "rms_norm", "--dtype", "f32"]


@pytest.fixture(scope="module")
def rms_norm_f32():
    impl = bite.reference_impl("rms_norm")
    if impl is None:
        pytest.skip("no correct rms_norm impl runnable here")
    return bite.audit_op(impl, ["f32"])


def test_mistakes_change_what_they_say():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    assert ulp_distance(bite.MISTAKES["scale16"](x, "f32"), x, "f32").min() >= 8
    moved = bite.ulp2(x, "f32")
    assert ulp_distance(moved, x, "f32").tolist() == [[0] * 4, [0] * 4, [0, 0, 0, 2]]
    b = x.astype(ml_dtypes.bfloat16)
    assert ulp_distance(bite.ulp2(b, "bf16"), b, "bf16").max() == 2
    assert (bite.zero_row(x, "f32")[0] == 0).all() and (bite.zero_row(x, "f32")[1:] == x[1:]).all()
    assert (bite.swap_rows(x, "f32")[[1, 0, 2]] == x).all()
    codes = np.arange(8, dtype=np.uint32).reshape(2, 4)
    assert bite.MISTAKES["scale4"](codes, "u32") is None and bite.ulp2(codes, "u32") is None
    assert (bite.zero_row(codes, "u32")[0] == 0).all()
    assert bite.swap_rows(x[:1], "f32") is None  # one row: nothing to swap


def test_rms_norm_f32_catches_rows_and_scale16(rms_norm_f32):
    a = rms_norm_f32
    assert a.impl.startswith(("torch:", "mlx:"))
    assert a.cases["f32"] > 0 and a.baseline["f32"] == 0
    for m in ("zero_row", "swap_rows", "scale16"):
        c = a.cells[("f32", m)]
        assert c.n == a.cases["f32"] and c.errors == 0
        assert c.failed / c.n > 0, m
    # a zeroed or swapped row is caught nearly everywhere (not in the all-zero-rows cases)
    assert a.cells[("f32", "zero_row")].failed / a.cells[("f32", "zero_row")].n > 0.8


def test_exit_code_follows_the_table(rms_norm_f32, capsys):
    rc = main(ARGS)
    out = capsys.readouterr().out
    misses = bite.uncaught([rms_norm_f32])
    assert rc == (1 if misses else 0)
    for op, m, n in misses:
        assert f"uncaught: {op} {m} passes all {n} cases" in out
    assert ("uncaught:" in out) == bool(misses)
    c = rms_norm_f32.cells[("f32", "zero_row")]
    assert f"{c.failed}/{c.n}" in out  # the table's cell


def test_toothless_mistake_is_reported_and_fails_the_audit(rms_norm_f32, monkeypatch, capsys):
    caught_only = {"zero_row": bite.zero_row}
    monkeypatch.setattr(bite, "MISTAKES", caught_only)
    monkeypatch.setattr(bite, "RUN_MISTAKES", {})
    assert main(ARGS) == 0  # the control: a mistake the gate catches, alone, exits 0
    capsys.readouterr()
    monkeypatch.setattr(bite, "MISTAKES", {**caught_only, "noop": lambda host, dtype: host})
    assert main(ARGS) == 1
    out = capsys.readouterr().out
    n = rms_norm_f32.cases["f32"]
    assert f"uncaught: rms_norm noop passes all {n} cases" in out
    assert f"0/{n} +{n}" in out  # its cell: no case fails, the mistake changed no bit in any
    assert "uncaught: rms_norm zero_row" not in out


def test_admitted_mistake_does_not_fail_the_audit(monkeypatch, capsys):
    monkeypatch.setattr(bite, "MISTAKES", {"noop": lambda host, dtype: host})
    monkeypatch.setattr(bite, "RUN_MISTAKES", {})
    monkeypatch.setattr(bite, "ADMITTED", {"rms_norm": {"noop": "changes nothing (a test)"}})
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "uncaught:" not in out and "admitted: rms_norm noop passes all" in out
    assert "0 of 1 (op, mistake) caught, 1 admitted, 0 uncaught" in out


def test_op_specific_mistakes_edit_what_they_say():
    from cases.model import Case, make_inputs

    norm = Case.make("rms_norm", {"rows": 3, "n": 64}, "f32", params={"eps": 1e-5})
    assert bite.eps_x10(norm, {})[0].params["eps"] == 1e-4
    gemv = Case.make("dequant_gemv", {"out": 16, "in": 256, "bits": 4, "group_size": 64}, "f32")
    host = make_inputs(gemv)
    assert bite.eps_x10(gemv, host) is None  # no eps
    _, edited = bite.code_pm1(gemv, host)
    w, w0 = edited["w"].reshape(-1), host["w"].reshape(-1)
    assert (w[0] ^ w0[0]) == 1 and (w[1:] == w0[1:]).all()  # code 0 of row 0, +- 1
    _, edited = bite.drop_last_term(gemv, host)
    assert edited["x"][-1] == 0 and (edited["x"][:-1] == host["x"][:-1]).all()
    assert bite.stale_state(gemv, host) is None and bite.code_pm1(norm, make_inputs(norm)) is None
    step = Case.make("ssm_step", {"batch": 2, "heads": 2, "dim_p": 16, "dim_n": 16,
                                  "groups": 1}, "f32")
    inputs = make_inputs(step)
    assert bite.stale_state(step, inputs)["state_out"] is inputs["state_in"]


def test_a_state_left_unwritten_is_caught_on_ssm_step():
    impl = bite.reference_impl("ssm_step")
    if impl is None:
        pytest.skip("no correct ssm_step impl runnable here")
    a = bite.audit_op(impl, ["f32"], mistakes={"stale_state": bite.stale_state})
    c = a.cells[("f32", "stale_state")]
    assert c.n == a.cases["f32"] > 0 and c.failed == c.n
