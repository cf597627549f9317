"""`kparity check --cases FILE`: user-written cases run against every selected impl of their op;
a bad field stops the run before anything launches, naming the file, the case and the field."""

from __future__ import annotations

import json

import pytest

from cases.casefile import CaseFileError, load_cases
from cases.model import Case
from results.store import Store
from verbs.cli import main

GOOD = {"op": "rms_norm", "dims": {"rows": 3, "n": 96}, "dtype": "bf16", "dist": "outlier_rows",
        "params": {"eps": 1e-5}, "label": "mine"}


def _file(tmp_path, cases, name="cases.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cases) if not isinstance(cases, str) else cases)
    return path


def test_cases_from_a_file_run_against_every_impl_of_their_op(tmp_path):
    path = _file(tmp_path, [GOOD, {"op": "rms_norm", "dims": {"rows": 1, "n": 64},
                                   "dtype": "f32"}])
    store = tmp_path / "store"
    assert main(["--store", str(store), "check", "--cases", str(path),
                 "--impl", "torch:rms_norm,torch:rms_norm_llama"]) == 0
    rows = Store(store).read("correctness").to_pylist()
    # torch:rms_norm_llama implements rounding='normed' only: the 'once' cases are refused
    assert sorted((r["impl"], r["dtype"], r["status"], r["label"]) for r in rows) == [
        ("torch:rms_norm", "bf16", "pass", "mine"), ("torch:rms_norm", "f32", "pass", "file:cases.json"),
        ("torch:rms_norm_llama", "bf16", "rejected", "mine"),
        ("torch:rms_norm_llama", "f32", "rejected", "file:cases.json")]
    assert {r["expect"] for r in rows if r["status"] == "rejected"} == {"rejected"}
    assert {json.loads(r["params"]).get("eps") for r in rows if r["label"] == "mine"} == {1e-5}


@pytest.mark.parametrize("case, field, words", [
    ({**GOOD, "op": "rmsnorm"}, "op",
     "unknown op 'rmsnorm'\n  valid ops (closest first): rms_norm"),
    ({k: v for k, v in GOOD.items() if k != "dims"}, "dims", "missing"),
    ({**GOOD, "dims": {"rows": 3}}, "dims.n", "missing: rms_norm needs rows, n"),
    ({**GOOD, "dims": {"rows": 3, "n": 96, "k": 2}}, "dims.k", "has no dim 'k'"),
    ({**GOOD, "dims": {"rows": -1, "n": 96}}, "dims.rows", "non-negative integer, got -1"),
    ({**GOOD, "dims": {"rows": 2.5, "n": 96}}, "dims.rows", "got 2.5"),
    ({**GOOD, "dtype": "fp16"}, "dtype", "unknown dtype 'fp16'; valid: f16"),
    ({**GOOD, "dist": "gaussian"}, "dist", "unknown distribution 'gaussian'"),
    ({**GOOD, "dist": "near_tie"}, "dist", "unknown distribution 'near_tie' for rms_norm"),
    ({**GOOD, "seed": "7"}, "seed", "non-negative integer"),
    ({**GOOD, "params": {"epsilon": 1e-5}}, "params.epsilon", "(closest first): eps"),
    # params are checked like dims: a declared value set (OpSpec.param_values), else the kind
    # of the default; unchecked, "twice" ran as "once" and 2 as ftz on
    ({**GOOD, "params": {"rounding": "twice"}}, "params.rounding",
     '"twice" is not a value of rms_norm\'s rounding; valid (closest first): "once", "normed"'),
    ({**GOOD, "params": {"ftz": 2}}, "params.ftz", "valid (closest first): 1, 0"),
    ({**GOOD, "params": {"eps": "1e-5"}}, "params.eps", 'expected a finite number (the default '
                                                        'is 1e-06), got "1e-5"'),
    ({**GOOD, "params": {"weight_offset": True}}, "params.weight_offset", "expected an integer"),
    ({**GOOD, "shape": [3, 96]}, "shape", "unknown field"),
    ({**GOOD, "oracle_version": 0}, "oracle_version", "rms_norm's oracle is version"),
    # 2^40 elements: no machine holds its float64 oracle; refused at load, not by the OOM killer
    ({**GOOD, "dims": {"rows": 2**20, "n": 2**20}}, "dims", "GiB of host memory"),
])
def test_a_bad_field_is_named_with_file_and_case(tmp_path, case, field, words):
    path = _file(tmp_path, [GOOD, case])
    with pytest.raises(CaseFileError) as err:
        load_cases(path)
    text = str(err.value)
    assert text.startswith(f"{path}: case 1") and f"field {field!r}" in text and words in text


def test_a_stored_case_json_is_a_valid_entry(tmp_path):
    case = Case.make("rms_norm", {"rows": 3, "n": 96}, "bf16", "nonfinite", 4, {"eps": 1e-5},
                     "x")
    loaded, = load_cases(_file(tmp_path, [json.loads(case.to_json())]))
    assert loaded.id == case.id


@pytest.mark.parametrize("content, words", [
    ("[{\"op\": ", "not JSON"), ("{}", "non-empty JSON list"), ("[]", "non-empty JSON list"),
    ("[3]", "case 0: expected an object")])
def test_a_bad_file_is_named(tmp_path, content, words):
    with pytest.raises(CaseFileError, match=words):
        load_cases(_file(tmp_path, content))


def test_the_cli_exits_2_before_running_anything(tmp_path, capsys):
    path = _file(tmp_path, [GOOD, {**GOOD, "dtype": "f8"}])
    store = tmp_path / "store"
    assert main(["--store", str(store), "check", "--cases", str(path)]) == 2
    out = capsys.readouterr().out
    assert "case 1 (rms_norm), field 'dtype'" in out
    assert Store(store).read("correctness").num_rows == 0
    assert main(["--store", str(store), "check", "--cases", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().out


def test_a_case_no_selected_impl_runs_is_an_error_naming_each_refusal(tmp_path, capsys):
    """Refused by every selected impl's contract, a user's case used to be recorded `rejected
    ok` and the run said OK with nothing launched. Now: exit 2 before anything runs, naming the
    case (index, label) in two lines; with --verbose, each impl's broken invariant."""
    normed = {**GOOD, "params": {"rounding": "normed"}}
    path = _file(tmp_path, [{**GOOD, "dtype": "f32", "label": ""}, normed])
    store = tmp_path / "store"
    argv = ["--store", str(store), "check", "--cases", str(path),
            "--impl", "torch:rms_norm,mlx:rms_norm_f32"]
    assert main(argv) == 2
    what, fix = capsys.readouterr().out.splitlines()
    assert what == (f"error: {path}: case 1 ('mine', rms_norm[n=96,rows=3] bf16 outlier_rows) "
                    "runs on no selected impl")
    assert fix.startswith("  change or drop them") and fix.endswith("--verbose: why each impl "
                                                                    "refuses")
    assert main([*argv, "--verbose"]) == 2
    out = capsys.readouterr().out
    assert f"{path}: case 1 ('mine', rms_norm[n=96,rows=3] bf16 outlier_rows) runs on no " \
           "selected impl" in out
    for impl in ("torch:rms_norm", "mlx:rms_norm_f32"):
        assert f"{impl}: contract invariant `rounding == 'once'` broken (rounding=normed)" in out
    assert "case 0" not in out and Store(store).read("correctness").num_rows == 0
    # one impl that runs it is enough: the other's refusal is recorded as before
    assert main(["--store", str(store), "check", "--cases", str(path),
                 "--impl", "torch:rms_norm,torch:rms_norm_llama"]) == 0


def test_a_dtype_an_impl_is_not_built_for_is_its_refusal_not_its_failure(tmp_path):
    """mlx:quantized_matmul is built for f32 only: a user's bf16 case is refused by its contract
    (as a violating case is), and runs on the impl that takes it."""
    case = {"op": "dequant_gemv", "dims": {"out": 32, "in": 64, "bits": 4, "group_size": 32},
            "dtype": "bf16"}
    store = tmp_path / "store"
    assert main(["--store", str(store), "check", "--cases", str(_file(tmp_path, [case])),
                 "--impl", "mlx:quantized_matmul,torch:dequant_linear"]) == 0
    rows = {r["impl"]: r for r in Store(store).read("correctness").to_pylist()}
    assert (rows["mlx:quantized_matmul"]["expect"], rows["mlx:quantized_matmul"]["status"]) == \
        ("rejected", "rejected")
    assert rows["torch:dequant_linear"]["status"] == "pass"


def test_host_bytes_counts_every_array_the_check_holds():
    """rms_norm f16, rows x n: x and the weight (f16 + a float64 copy each), out (two f16
    buffers, exact, rounded and bound in float64)."""
    from cases.casefile import host_bytes
    from cases.model import Case

    rows, n = 3, 64
    case = Case.make("rms_norm", {"rows": rows, "n": n}, "f16")
    assert host_bytes(case) == rows * n * (2 + 8) + n * (2 + 8) + rows * n * (2 * 2 + 3 * 8)


def test_a_case_outside_its_ops_domain_is_refused_at_load(tmp_path):
    """dims and params that pass alone but not together (OpSpec.domain): a sequence that
    appends past the cache's max_len would have been an `error` row on every impl."""
    case = {"op": "kv_cache_update", "dims": {"heads": 2, "head_dim": 32, "max_len": 16},
            "dtype": "f32", "params": {"cache_lens": [10], "new_lens": [7]}}
    path = _file(tmp_path, [case])
    with pytest.raises(CaseFileError) as err:
        load_cases(path)
    assert "field 'dims.max_len'" in str(err.value) and "appends 7: more than max_len=16" in str(err.value)
