"""`kparity check --repeat N`: every case N times; bits that differ between repeats fail an impl
that declares determinism (and are flagged otherwise); a NaN in one repeat fails the case."""

from __future__ import annotations

import json
from cases.distributions import DISTRIBUTIONS
from pathlib import Path

from results.store import Store
from verbs.cli import main

FAULTS = str(Path(__file__).with_name("faults.py"))
CASES = ["--preset", "qwen3-0.6b", "--dtype", "bf16", "--isolate", "none"]


def _rows(store):
    return {(r["impl"], r["dist"]): r for r in Store(store).read("correctness").to_pylist()}


def test_repeats_of_a_deterministic_impl_pass(tmp_path):
    assert main(["--store", str(tmp_path), "check", "--impl", "torch:rms_norm", *CASES,
                 "--repeat", "3"]) == 0
    rows = _rows(tmp_path)
    assert len(rows) == len(DISTRIBUTIONS) and all(r["flags"].endswith("repeats:3") for r in rows.values())
    assert all(len(v["digest"]) == 16 for r in rows.values()
               for v in json.loads(r["outputs_json"]).values())


def test_differing_bits_fail_only_an_impl_declaring_determinism(tmp_path, capsys):
    rc = main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
               "torch:fault_jitter,torch:fault_jitter_declared", *CASES, "--repeat", "2"])
    assert rc == 1
    rows = _rows(tmp_path)
    # the cases whose outputs hold exact zeros: zero rows, tiny values that underflow in bf16,
    # and the finite elements of the rows holding an inf (rsqrt(inf) = 0)
    with_zeros = {"zero_rows", "tiny", "nonfinite"}
    for dist in with_zeros:
        declared = rows[("torch:fault_jitter_declared", dist)]
        loose = rows[("torch:fault_jitter", dist)]
        assert declared["status"] == "fail"
        assert "nondeterministic: out differ" in declared["message"]
        assert loose["status"] == "pass" and "nondeterministic:out" in loose["flags"]
    others = [r for (impl, dist), r in rows.items() if dist not in with_zeros]
    assert len(others) == 2 * (len(DISTRIBUTIONS) - 3)
    assert {r["status"] for r in others} == {"pass"}
    assert not any("nondeterministic" in r["flags"] for r in others)
    assert "fail, by kind: 3 nondeterministic" in capsys.readouterr().out


def test_a_nan_in_one_repeat_fails_the_case(tmp_path):
    assert main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_nan_once", *CASES, "--repeat", "2"]) == 1
    rows = list(_rows(tmp_path).values())
    failing = [r for r in rows if r["status"] == "fail"]
    assert len(rows) == len(failing) == len(DISTRIBUTIONS)  # every case: its second call is NaN
    assert all(r["message"].startswith("repeat 2 of 2:") for r in failing)
    # one repeat alone does not see it
    assert main(["--store", str(tmp_path / "once"), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_nan_once", *CASES, "--preset", "qwen3-8b"]) == 0


def test_repeat_below_one_is_bad_input(tmp_path, capsys):
    assert main(["--store", str(tmp_path), "check", "--repeat", "0"]) == 2
    assert "--repeat 0" in capsys.readouterr().out


def test_repeats_stop_at_the_first_failing_one(tmp_path):
    """fault_nan_once returns NaN on its second call: with --repeat 3 the third never runs."""
    from gpu_impls import impls, load_plugin

    load_plugin(FAULTS)
    calls = impls()["torch:fault_nan_once"].run.__globals__["_calls"]  # the plugin's counters
    calls.clear()  # other tests of this process called it already
    assert main(["--store", str(tmp_path), "--plugin", FAULTS, "check", "--impl",
                 "torch:fault_nan_once", *CASES, "--repeat", "3"]) == 1
    rows = Store(tmp_path).read("correctness").to_pylist()
    assert all(r["message"].startswith("repeat 2 of 3: ") for r in rows)
    assert {n for (kind, case_id), n in calls.items()
            if kind == "nan" and case_id in {r["case_id"] for r in rows}} == {2}
